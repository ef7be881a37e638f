"""The server freezes its start-up heap: full collections no longer walk it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from backends.embeddings.base import Embedder
from gateway.server import heap
from gateway.server.app import create_app
from gateway.settings import Settings
from tests.fakes.llm import FakeLLM
from tests.fixtures.app import fake_services


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
    unfrozen: None, tmp_path: Path, served_embedder: Embedder
) -> None:
    settings = Settings.model_validate(
        {"data_dir": tmp_path, "cache": {"backend": "off"}, "server": {"reload_poll_s": 0}}
    )
    for freeze_heap in (False, True):
        async with AsyncExitStack() as stack:
            services = await fake_services(stack, settings, FakeLLM(tiers=()), served_embedder)
            app = create_app(settings, services=services, freeze_heap=freeze_heap)
            client = await stack.enter_async_context(TestClient(TestServer(app)))
            if freeze_heap:
                assert gc.get_freeze_count() > 1000  # frozen while its backends started
            else:  # an app built for a test leaves the collector alone
                assert gc.get_freeze_count() == 0
            assert (await client.get("/healthz")).status == 200
