"""The process's Redis connection against real servers: the URL's mode is checked against the
server, a Redis that is down at start-up only delays it, and its bounds hold."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis.exceptions

from backends.errors import BackendUnavailable
from backends.redis_client import (
    RedisConnection,
    RedisModeMismatch,
    RedisOptions,
    RequestBudgetSpent,
    RequestSpend,
)
from tests.redis_server import RedisCluster, RedisServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_cluster_scheme_is_stripped_for_the_client() -> None:
    options = RedisOptions("rediss+cluster://user:pw@node1:7000")
    assert options.cluster
    assert options.client_url == "rediss://user:pw@node1:7000"
    assert not RedisOptions("redis://127.0.0.1:6379/0").cluster


async def test_single_node_start_reports_the_server(redis_server: RedisServer) -> None:
    connection = RedisConnection(RedisOptions(redis_server.url))
    try:
        await connection.start()
        assert connection.facts is not None
        assert connection.facts.version.startswith("7.")
        assert not connection.facts.cluster
        assert connection.facts.vector_search is None  # Debian's 7.0 has none
        await connection.ping()
    finally:
        await connection.aclose()


async def test_cluster_url_builds_a_cluster_client(redis_cluster: RedisCluster) -> None:
    url = redis_cluster.urls[1].replace("redis://", "redis+cluster://")
    connection = RedisConnection(RedisOptions(url))
    try:
        await connection.start()
        assert connection.facts is not None and connection.facts.cluster
        for i in range(30):  # keys on every master, reached through one seed node
            await connection.call(connection.client.set(f"k{i}", i))
        assert await connection.call(connection.client.get("k29")) == b"29"
    finally:
        await connection.aclose()


async def test_one_pause_of_the_server_is_not_an_outage(redis_server: RedisServer) -> None:
    """As shipped the socket timeout is the budget (0.25 s), so a PING that meets a pause of
    the server (a fork, an fsync) times out: the probe tries again rather than call a healthy
    Redis down."""
    connection = RedisConnection(RedisOptions(redis_server.url))
    assert connection.options.socket_timeout_s == connection.options.request_budget_s
    try:
        await connection.ping()  # the prober's connection is open
        redis_server.pause()
        resume = threading.Timer(0.3, redis_server.resume)
        resume.start()
        try:
            await connection.ping()
        finally:
            resume.join()
    finally:
        redis_server.resume()
        await connection.aclose()


async def test_a_server_that_never_answers_is_down(redis_server: RedisServer) -> None:
    connection = RedisConnection(RedisOptions(redis_server.url))
    try:
        await connection.ping()
        redis_server.pause()
        with pytest.raises(BackendUnavailable, match="no PING answered"):
            await connection.ping()
    finally:
        redis_server.resume()
        await connection.aclose()


def pings_run(node: RedisServer) -> int:
    stats = node.command("INFO", "commandstats").decode()
    line = next((x for x in stats.splitlines() if x.startswith("cmdstat_ping:")), "calls=0,")
    return int(line.split("calls=", 1)[1].split(",", 1)[0])


async def test_a_cluster_ping_asks_every_primary(redis_cluster: RedisCluster) -> None:
    """The health verdict on a cluster is every primary's: one that is slow or gone is
    a share of every tenant's keys out of reach."""
    connection = RedisConnection(
        RedisOptions(redis_cluster.urls[0].replace("redis://", "redis+cluster://"))
    )
    try:
        await connection.start()
        before = [pings_run(node) for node in redis_cluster.nodes]
        await connection.ping()
        after = [pings_run(node) for node in redis_cluster.nodes]
        assert all(b - a >= 1 for a, b in zip(before, after, strict=True)), (before, after)
    finally:
        await connection.aclose()


async def test_a_ping_is_timed_on_its_own_connection_not_the_pools(
    redis_server: RedisServer,
) -> None:
    """Every pool connection held (a burst past max_connections): the health verdict does not
    wait for one, and a healthy Redis is up."""
    options = RedisOptions(redis_server.url, max_connections=1, socket_timeout_s=1.0)
    connection = RedisConnection(options)
    await connection.start()
    try:
        busy = asyncio.create_task(connection.call(connection.client.blpop(["qg:none"], 0.5)))
        await asyncio.sleep(0.02)
        await connection.ping()
        assert not busy.done()  # answered while the one pool connection was still held
        await busy
    finally:
        await connection.aclose()


async def test_a_started_cluster_client_takes_a_burst_of_first_calls(
    redis_cluster: RedisCluster,
) -> None:
    """`start` maps the slots, so a burst that arrives first after start-up (production
    timeouts) does not race the client's lazy mapping of them."""
    url = redis_cluster.urls[0].replace("redis://", "redis+cluster://")
    # Wide timeouts: this is about the slot map, and a loaded CI machine took over the 0.5 s
    # connect timeout to open the burst's connections (the client then leaked a node).
    connection = RedisConnection(RedisOptions(url, socket_timeout_s=2.0, connect_timeout_s=5.0))
    try:
        await connection.start()
        keys = [f"burst{i}" for i in range(60)]  # on every master
        await asyncio.gather(*(connection.call(connection.client.set(k, 1)) for k in keys))
        assert await connection.call(connection.client.get("burst59")) == b"1"
    finally:
        await connection.aclose()


async def test_a_single_node_url_on_a_cluster_node_refuses_to_start(
    redis_cluster: RedisCluster,
) -> None:
    connection = RedisConnection(RedisOptions(redis_cluster.urls[0]))
    try:
        with pytest.raises(RedisModeMismatch, match=r"redis\+cluster://"):
            await connection.start()
    finally:
        await connection.aclose()


async def test_a_cluster_url_on_a_single_node_refuses_to_start(redis_server: RedisServer) -> None:
    url = redis_server.url.replace("redis://", "redis+cluster://").removesuffix("/0")
    connection = RedisConnection(RedisOptions(url))
    try:
        with pytest.raises(RedisModeMismatch):
            await connection.start()
    finally:
        await connection.aclose()


async def test_redis_down_at_start_only_delays_it(redis_server: RedisServer) -> None:
    redis_server.kill()
    connection = RedisConnection(RedisOptions(redis_server.url))
    try:
        await connection.start()  # a warning, not a refusal: the cache fails open
        assert connection.facts is None
        with pytest.raises(BackendUnavailable) as failed:
            await connection.ping()
        # The refused connection is the answer, not a timeout waited out.
        assert isinstance(failed.value.__cause__, redis.exceptions.ConnectionError)
        redis_server.start()
        await connection.ping()  # the pool connects by itself
    finally:
        await connection.aclose()


async def test_nothing_listening_fails_within_the_connect_timeout() -> None:
    connection = RedisConnection(RedisOptions(f"redis://127.0.0.1:{free_port()}/0"))
    try:
        with pytest.raises(BackendUnavailable) as failed:
            await connection.ping()
        # Refused at the connect: neither the connect timeout nor the call's bound waited out.
        assert isinstance(failed.value.__cause__, redis.exceptions.ConnectionError)
        assert "connecting" in str(failed.value.__cause__)
    finally:
        await connection.aclose()


async def test_a_closed_connection_refuses_calls(redis_server: RedisServer) -> None:
    connection = RedisConnection(RedisOptions(redis_server.url))
    await connection.aclose()
    await connection.aclose()  # idempotent
    with pytest.raises(BackendUnavailable):
        await connection.ping()


@pytest.mark.parametrize("mode", ["single", "cluster"])
async def test_more_calls_than_connections_wait_for_one_rather_than_fail(
    mode: str, request: pytest.FixtureRequest
) -> None:
    """redis-py's pool refuses a call past its size at once (MaxConnectionsError), which every
    caller reads as Redis down; a burst past the pool must wait for a connection instead."""
    if mode == "single":
        url = request.getfixturevalue("redis_server").url
    else:
        url = request.getfixturevalue("redis_cluster").urls[0]
        url = url.replace("redis://", "redis+cluster://")
    # What is tested is the wait, not its speed: timeouts sized for a loaded CI core, where
    # opening a cluster connection in a burst of 40 calls can take past the 0.5 s default.
    options = RedisOptions(
        url, max_connections=4, socket_timeout_s=5.0, connect_timeout_s=5.0, request_budget_s=None
    )
    connection = RedisConnection(options)
    try:
        await connection.start()
        keys = [f"many{{{i % 7}}}" for i in range(40)]
        await asyncio.gather(*(connection.call(connection.client.incr(k)) for k in keys))
        totals = [
            int(await connection.call(connection.client.get(f"many{{{i}}}"))) for i in range(7)
        ]
        assert sum(totals) == 40
    finally:
        await connection.aclose()


async def test_a_requests_calls_share_one_time_budget_on_a_slow_redis(
    redis_server: RedisServer,
) -> None:
    """A paused Redis (connections accepted, nothing answered) costs a request at most its
    Redis time budget in all, not one socket timeout per call."""
    options = RedisOptions(redis_server.url, socket_timeout_s=0.25, request_budget_s=0.3)
    connection = RedisConnection(options)
    await connection.start()
    try:
        await connection.ping()
        redis_server.pause()
        spend = RequestSpend()
        failures: list[BackendUnavailable] = []
        for _ in range(5):
            try:
                await connection.call(connection.client.get("qg:absent"), spend)
            except BackendUnavailable as exc:
                failures.append(exc)
        assert len(failures) == 5
        # The first call waits out its socket timeout (0.25 s of the 0.3 s budget); what is
        # left cuts the second at most, and the last three are never sent: a spent budget
        # refuses at once, where 5 socket timeouts, one a call, would take ~1.3 s.
        assert not isinstance(failures[0], RequestBudgetSpent)
        assert all(isinstance(f, RequestBudgetSpent) for f in failures[1:])
        assert all(f.__cause__ is None for f in failures[2:])
        assert spend.spent_s >= options.request_budget_s
    finally:
        redis_server.resume()
        await connection.aclose()
