"""When an index counts as stale: an expectation is set and it went longer without a change."""

from __future__ import annotations

from backends.retrieval.versions import Freshness
from gateway.core.freshness import is_stale


def test_staleness_needs_an_expectation_and_counts_a_never_written_index() -> None:
    written = Freshness(1, 1, last_write=1000.0, version=1, model="")
    never = Freshness(0, 0, last_write=None, version=1, model="")
    assert not is_stale(written, None, now=10**9)
    assert not is_stale(written, 60, now=1059)
    assert is_stale(written, 60, now=1061)
    assert is_stale(never, 60, now=1000)
    assert not is_stale(never, None, now=1000)
