"""querygate_dependency_up from the health watch, in process, on real backends: the gauge
follows a backend going down and coming back, and no failure of a probe stops the watch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from backends.cache.memory import MemoryCacheStore
from backends.cache.redis import RedisCacheStore
from backends.redis_client import RedisConnection, RedisOptions
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.core.health import watch_dependencies
from gateway.core.services import Services
from gateway.obs.metrics import Metrics
from tests.metrics import Scrape
from tests.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

EVERY_S = 0.05
DEADLINE_S = 15.0


class BreakableRetriever:
    """The real embedded retriever behind the `Retriever` seam's ping, which can be made to
    raise what no backend seam should (a bug's exception, not a BackendError)."""

    def __init__(self, inner: EmbeddedRetriever) -> None:
        self.inner = inner
        self.broken = True

    async def ping(self) -> None:
        if self.broken:
            raise RuntimeError("a bug in the ping")
        await self.inner.ping()


@pytest.fixture
async def retriever(tmp_path: Path) -> AsyncIterator[EmbeddedRetriever]:
    index = EmbeddedRetriever(tmp_path / "index.sqlite3")
    yield index
    await index.aclose()


def up(metrics: Metrics, dependency: str) -> float | None:
    """The scraped value of querygate_dependency_up{dependency}, None while it has none."""
    return Scrape.of(metrics).get("querygate_dependency_up", dependency=dependency)


async def until(metrics: Metrics, dependency: str, value: float) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while up(metrics, dependency) != value:
        assert time.monotonic() < deadline, (dependency, up(metrics, dependency), value)
        await asyncio.sleep(EVERY_S / 2)


def watch(retriever: object, cache_store: object, metrics: Metrics) -> asyncio.Task[None]:
    services = SimpleNamespace(retriever=retriever, cache_store=cache_store, quotas=None)
    return asyncio.create_task(watch_dependencies(cast(Services, services), metrics, EVERY_S))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def logged(
    caplog: pytest.LogCaptureFixture, message: str, dependency: str
) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage() == message and getattr(r, "dependency", None) == dependency
    ]


async def test_the_cache_gauge_goes_to_0_while_redis_is_down_and_back_to_1_when_it_returns(
    redis_server: RedisServer,
    retriever: EmbeddedRetriever,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.core.health")
    connection = RedisConnection(RedisOptions(redis_server.url, socket_timeout_s=0.2))
    await connection.start()
    metrics = Metrics()
    task = watch(retriever, RedisCacheStore(connection), metrics)
    try:
        await until(metrics, "cache", 1)
        assert not logged(caplog, "dependency down", "cache")

        await asyncio.to_thread(redis_server.kill)
        await until(metrics, "cache", 0)
        assert up(metrics, "retrieval") == 1
        (down,) = logged(caplog, "dependency down", "cache")  # once, not once per probe
        assert down.levelno == logging.WARNING and down.exc_info is None  # a BackendError

        await asyncio.to_thread(redis_server.start)
        await until(metrics, "cache", 1)
        assert logged(caplog, "dependency up again", "cache")
        assert not task.done()
    finally:
        await stop(task)
        await connection.aclose()


async def test_a_ping_raising_an_unexpected_exception_reports_down_and_the_watch_goes_on(
    retriever: EmbeddedRetriever, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.core.health")
    breakable = BreakableRetriever(retriever)  # broken from the start
    metrics = Metrics()
    task = watch(breakable, MemoryCacheStore(), metrics)
    try:
        await until(metrics, "retrieval", 0)
        await until(metrics, "cache", 1)  # the other dependency is still probed
        # Down from the very first probe is logged, with the exception's traceback.
        (down,) = logged(caplog, "dependency down", "retrieval")
        assert down.exc_info is not None and isinstance(down.exc_info[1], RuntimeError)
        assert "a bug in the ping" in getattr(down, "error", "")

        breakable.broken = False
        await until(metrics, "retrieval", 1)
        assert logged(caplog, "dependency up again", "retrieval")
        assert not task.done()
    finally:
        await stop(task)
