"""The server freezes its start-up heap: full collections no longer walk it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.server import heap
from gateway.server.app import create_app
from gateway.settings import Settings


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


@pytest.mark.asyncio(loop_scope="session")
async def test_the_server_s_app_freezes_its_heap_before_it_is_ready(
    unfrozen: None, tmp_path: Path
) -> None:
    settings = Settings.model_validate(
        {"data_dir": tmp_path, "cache": {"backend": "off"}, "server": {"reload_poll_s": 0}}
    )
    async with TestClient(TestServer(create_app(settings))) as client:
        assert gc.get_freeze_count() == 0  # an app built for a test leaves the collector alone
        assert (await client.get("/healthz")).status == 200
    async with TestClient(TestServer(create_app(settings, freeze_heap=True))) as client:
        assert gc.get_freeze_count() > 1000  # frozen while its backends started
        assert (await client.get("/healthz")).status == 200
