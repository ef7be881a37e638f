"""Every configuration key is classified: a reload applies it, or refuses it as restart-only.

The walk covers the whole model, so a key added anywhere fails here until it is listed in
gateway/server/live_keys.py (LIVE for a key a reload applies, RESTART_ONLY otherwise)."""

from __future__ import annotations

import pytest

from gateway.server.live_keys import LIVE, RESTART_ONLY, changed_keys, config_keys, restart_only
from gateway.settings import Settings

KEYS = list(config_keys(Settings))


def covering(key: str) -> list[str]:
    """The entries of either list that cover `key`."""
    live = [entry for entry in LIVE if entry == key]
    restart = [entry for entry in RESTART_ONLY if key == entry or key.startswith(f"{entry}.")]
    return live + restart


def test_the_walk_reaches_every_section_and_stops_at_lists() -> None:
    for key in ("server.admission.queries.max_inflight", "retrieval.rerank.remote.model"):
        assert key in KEYS
    # A list of sections is one key, compared whole.
    assert "tenants" in KEYS
    assert "router.rules" in KEYS
    assert "models.small.fallbacks" in KEYS
    assert not [key for key in KEYS if key.startswith(("tenants.", "router.rules."))]


@pytest.mark.parametrize("key", KEYS)
def test_each_key_is_live_or_restart_only_exactly_once(key: str) -> None:
    found = covering(key)
    assert len(found) == 1, (
        f"{key}: covered by {found or 'nothing'}; list it once in "
        "gateway/server/live_keys.py, LIVE if a reload applies it, else RESTART_ONLY"
    )


def test_every_live_entry_is_one_key() -> None:
    # A section in LIVE would make the keys added to it live without anyone checking.
    assert sorted(set(LIVE) - set(KEYS)) == []
    assert len(LIVE) == len(set(LIVE))


def test_every_restart_only_entry_names_a_key_or_a_section() -> None:
    for entry in RESTART_ONLY:
        assert any(key == entry or key.startswith(f"{entry}.") for key in KEYS), entry


def test_a_changed_secret_alone_is_seen_and_refused() -> None:
    active = Settings.model_validate({"cache": {"redis_url": "redis://cache:6379/0?password=a"}})
    new = Settings.model_validate({"cache": {"redis_url": "redis://cache:6379/0?password=b"}})
    assert changed_keys(active, new) == ["cache.redis_url"]
    assert restart_only(changed_keys(active, new)) == ["cache.redis_url"]
    assert new.version != active.version


def test_a_key_in_neither_list_is_refused() -> None:
    assert restart_only(["server.some_new_key"]) == ["server.some_new_key"]
