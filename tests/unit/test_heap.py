"""The server freezes its start-up heap: full collections no longer walk it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gateway import heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_freeze_collects_the_garbage_then_freezes_what_lives(unfrozen: None) -> None:
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    alive = Node()
    heap.freeze()
    assert gone() is None  # collected first, not frozen for ever
    assert gc.get_freeze_count() > 0
    # frozen: in no generation a collection walks
    assert not any(o is alive for o in gc.get_objects())
