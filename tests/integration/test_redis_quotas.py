"""The Redis quota store against a real redis-server (single node and a three-master cluster):
the bucket and the day's spend are shared by every connection, atomic under concurrency, kept
per tenant under its hash tag, and a dead Redis is an error the gateway can fall back from."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
import redis.exceptions

from backends.errors import BackendError, BackendUnavailable, UpstreamError
from backends.quotas.redis import RedisQuotaStore, applied_key, bucket_key, spend_key
from backends.redis_client import RedisConnection, RedisOptions, RequestSpend
from gateway.limits.quotas import BudgetExceeded, BudgetUnknown, Quotas, RateLimited
from gateway.limits.shared_store import utc_day
from gateway.obs.metrics import Metrics
from gateway.settings import TenantConfig
from tests.fixtures.gateway import TcpProxy
from tests.metrics import Scrape
from tests.redis_server import RedisServer


def today() -> str:
    """Read when used: a suite that runs past midnight UTC spends on the new day."""
    return utc_day(time.time())


@asynccontextmanager
async def store(url: str, timeout_s: float | None = None) -> AsyncIterator[RedisQuotaStore]:
    """One process's view: its own connection (pool) and store; `timeout_s` replaces the
    production socket and connect timeouts where a test is about something else."""
    options = RedisOptions(url)
    if timeout_s is not None:
        options = replace(options, socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)
    connection = RedisConnection(options)
    await connection.start()
    try:
        yield RedisQuotaStore(connection)
    finally:
        await connection.aclose()


def cluster_url(urls: list[str]) -> str:
    return "redis+cluster://" + urls[0].removeprefix("redis://")


@pytest.fixture(params=["single", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "single":
        return str(request.getfixturevalue("redis_url"))
    return cluster_url(request.getfixturevalue("redis_cluster_urls"))


def new_id() -> str:
    """An amount's id: `<origin>:<seq>`, here the first amount of a new origin."""
    return f"{uuid.uuid4().hex}:1"


def tenant_id(prefix: str) -> str:
    """A tenant no other test used (the cluster lives for the module)."""
    return f"{prefix}-{time.monotonic_ns()}"


async def test_two_processes_share_one_bucket(url: str) -> None:
    acme = tenant_id("acme")
    async with store(url) as one, store(url) as two:
        started = time.monotonic()
        waits = [await s.take(acme, 0.5, 3) for s in (one, two, one, two)]
        elapsed = time.monotonic() - started
    assert waits[:3] == [0.0, 0.0, 0.0]
    # a token every 2 s, less what has refilled since the first take
    assert 2.0 - 0.5 * 2.0 * elapsed - 0.1 < waits[3] <= 2.0


async def test_a_tenant_at_its_limit_leaves_another_untouched(url: str) -> None:
    acme, globex = tenant_id("acme"), tenant_id("globex")
    async with store(url) as s:
        assert await s.take(acme, 0.5, 1) == 0.0
        assert await s.take(acme, 0.5, 1) > 0
        assert await s.take(globex, 0.5, 1) == 0.0
        await s.add_spend(acme, today(), 5.0, new_id())
        assert await s.spent(globex, today()) == 0.0


async def test_the_slowest_and_largest_bucket_allowed_works(url: str) -> None:
    acme = tenant_id("acme")
    async with store(url) as s:
        assert await s.take(acme, 1e-4, 1_000_000) == 0.0  # its TTL: 1e13 ms, as an integer


async def test_the_bucket_refills_on_the_servers_clock(url: str) -> None:
    acme = tenant_id("acme")
    async with store(url) as s:
        assert await s.take(acme, 20.0, 1) == 0.0
        wait = await s.take(acme, 20.0, 1)
        assert 0 < wait <= 0.05
        await asyncio.sleep(wait + 0.01)  # the time it said: the token is back
        assert await s.take(acme, 20.0, 1) == 0.0


async def test_concurrent_spend_from_two_processes_is_added_exactly(url: str) -> None:
    acme = tenant_id("acme")
    # About atomic addition, not timeouts: opening 40 connections at once on a loaded 2-core
    # CI machine can take longer than the production connect timeout (0.5 s).
    async with store(url, timeout_s=5.0) as one, store(url, timeout_s=5.0) as two:
        adds = [s.add_spend(acme, today(), 0.01, new_id()) for _ in range(20) for s in (one, two)]
        totals = await asyncio.gather(*adds)
        assert await one.spent(acme, today()) == pytest.approx(0.4)
    assert max(totals) == pytest.approx(0.4)
    assert len({round(t, 6) for t in totals}) == 40  # every add saw its own total


async def test_a_days_spend_expires_an_hour_after_the_day(redis_server: RedisServer) -> None:
    acme = tenant_id("acme")
    async with store(redis_server.url) as s:
        await s.add_spend(acme, today(), 0.5, new_id())
    ttl = int(redis_server.command("TTL", spend_key(acme, today())).strip().lstrip(b":"))
    day_end = dt.datetime.strptime(today(), "%Y-%m-%d").replace(tzinfo=dt.UTC) + dt.timedelta(1)
    expected = day_end.timestamp() + 3600 - time.time()
    assert abs(ttl - expected) <= 5


async def test_every_key_of_a_tenant_is_in_the_tenants_slot() -> None:
    assert bucket_key("acme") == "qg:quota:{acme}:bucket"
    assert spend_key("acme", "2026-11-30") == "qg:quota:{acme}:spend:2026-11-30"


async def test_garbage_in_a_spend_key_is_an_error_never_a_limit(
    redis_server: RedisServer,
) -> None:
    acme = tenant_id("acme")
    redis_server.command("SET", spend_key(acme, today()), "not a number")
    async with store(redis_server.url) as s:
        with pytest.raises(BackendError):
            await s.spent(acme, today())
        with pytest.raises(BackendError):
            await s.add_spend(acme, today(), 0.1, new_id())


async def test_a_killed_redis_fails_fast_and_a_restarted_one_is_used_again(
    redis_server: RedisServer,
) -> None:
    acme = tenant_id("acme")
    async with store(redis_server.url) as s:
        assert await s.take(acme, 1.0, 5) == 0.0
        redis_server.kill()
        with pytest.raises(BackendUnavailable) as failed:
            await s.take(acme, 1.0, 5)
        # Fast: the refused connection is the answer, not a timeout waited out.
        assert isinstance(failed.value.__cause__, redis.exceptions.ConnectionError)
        redis_server.start()
        assert await s.take(acme, 1.0, 5) == 0.0  # the script is loaded again (NOSCRIPT)


async def test_a_paused_redis_costs_one_socket_timeout(redis_server: RedisServer) -> None:
    acme = tenant_id("acme")
    async with store(redis_server.url) as s:
        await s.spent(acme, today())
        sent = commands_run(redis_server, "get")
        redis_server.pause()
        try:
            with pytest.raises(BackendUnavailable) as failed:
                await s.spent(acme, today())
        finally:
            redis_server.resume()
        # The socket timeout ended it (not the call's whole bound), after one GET: no retry.
        # The paused server runs what it was sent once it resumes.
        assert isinstance(failed.value.__cause__, redis.exceptions.TimeoutError)
        assert commands_run(redis_server, "get") == sent + 1


def commands_run(server: RedisServer, command: str) -> int:
    """How many `command` calls the server has run (INFO commandstats)."""
    stats = server.command("INFO", "commandstats").decode()
    for line in stats.splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


class CountingStore(RedisQuotaStore):
    """The real store, counting the bucket calls that reach Redis."""

    takes = 0

    async def take(
        self, tenant: str, rate_per_s: float, burst: float, *, spend: RequestSpend | None = None
    ) -> float:
        self.takes += 1
        return await super().take(tenant, rate_per_s, burst, spend=spend)


async def test_a_slow_redis_is_asked_again_by_one_request_not_by_every_one_waiting(
    redis_server: RedisServer,
) -> None:
    """Once the retry interval is over, the requests that arrive while the one retry waits
    on a paused (slow) Redis decide here: without it each paid a socket timeout too."""
    acme = TenantConfig.model_validate(
        {
            "id": tenant_id("acme"),
            "api_key_sha256": "0" * 64,
            "rate_limit": {"requests_per_s": 1000, "burst": 1000},
        }
    )
    connection = RedisConnection(RedisOptions(redis_server.url))
    await connection.start()
    counting = CountingStore(connection)
    metrics = Metrics()
    quotas = Quotas(counting, metrics, retry_s=0.2)
    try:
        await quotas.admit(acme, answering=False)
        redis_server.pause()
        try:
            await quotas.admit(acme, answering=False)  # times out: degraded
            assert quotas.degraded
            await asyncio.sleep(0.25)  # the retry interval is over
            counting.takes = 0
            await asyncio.gather(*(quotas.admit(acme, answering=False) for _ in range(10)))
        finally:
            redis_server.resume()
        assert counting.takes == 1
        local = Scrape.of(metrics).get("querygate_quota_local_decisions_total", check="rate_limit")
        assert local == 11.0  # the timed-out call, then all ten
    finally:
        await connection.aclose()


async def test_a_burst_past_the_pool_size_keeps_the_limits_shared(url: str) -> None:
    """Rate limits are taken before admission, so a burst of requests (one tenant's flood
    will do) makes more Redis calls at once than the pool has connections (64). Each was
    refused by the client as if Redis were down: every tenant's limits went per process."""
    flood = TenantConfig.model_validate(
        {
            "id": tenant_id("flood"),
            "api_key_sha256": "0" * 64,
            "rate_limit": {"requests_per_s": 0.01, "burst": 50},
        }
    )
    metrics = Metrics()
    # About the pool, not timeouts: on a loaded 2-core CI machine 150 calls and 64 connects
    # at once take longer than the production whole-call bound (1.05 s), and a call past it
    # is Redis too slow (by design). A call refused by the pool fails at once, whatever the
    # timeouts: the semaphore is what this test guards.
    async with store(url, timeout_s=5.0) as s:
        quotas = Quotas(s, metrics, retry_s=60.0)
        outcomes = await asyncio.gather(
            *(quotas.admit(flood, answering=False) for _ in range(150)), return_exceptions=True
        )
        assert not quotas.degraded
        assert sum(isinstance(o, RateLimited) for o in outcomes) == 100  # one shared bucket
        assert all(o is None or isinstance(o, RateLimited) for o in outcomes)
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0


async def test_two_gateways_quotas_share_the_limit_and_the_budget(url: str) -> None:
    acme, globex = limited(tenant_id("acme"), budget=0.25), limited(tenant_id("globex"))
    async with store(url) as s1, store(url) as s2:
        one, two = Quotas(s1, Metrics()), Quotas(s2, Metrics())
        await one.admit(acme, answering=True)
        await two.admit(acme, answering=True)
        for quotas in (two, one):  # a burst of 2, spent across both
            with pytest.raises(RateLimited):
                await quotas.admit(acme, answering=False)
        await one.admit(globex, answering=False)  # its own bucket
        await one.record_spend(acme, 0.125)
        await two.check_budget(acme)
        await two.record_spend(acme, 0.125)
        for quotas in (one, two):
            with pytest.raises(BudgetExceeded):
                await quotas.check_budget(acme)
        assert not one.degraded and not two.degraded


def limited(name: str, budget: float | None = None) -> TenantConfig:
    return TenantConfig.model_validate(
        {
            "id": name,
            "api_key_sha256": "0" * 64,
            "rate_limit": {"requests_per_s": 0.1, "burst": 2},
            "daily_budget_usd": budget,
        }
    )


async def test_redis_killed_the_limits_hold_per_process_and_come_back_shared(
    redis_server: RedisServer,
) -> None:
    acme = limited(tenant_id("acme"), budget=1.0)
    metrics = Metrics()
    async with store(redis_server.url) as s:
        quotas = Quotas(s, metrics, retry_s=0.2)
        await quotas.admit(acme, answering=True)
        await quotas.record_spend(acme, 0.7)
        redis_server.kill()
        await quotas.admit(acme, answering=True)  # the local bucket: full
        await quotas.admit(acme, answering=True)
        with pytest.raises(RateLimited):
            await quotas.admit(acme, answering=True)
        await quotas.record_spend(acme, 0.4)  # 0.7 seen + 0.4 kept here
        with pytest.raises(BudgetExceeded):
            await quotas.check_budget(acme)
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 1.0
        redis_server.start()  # empty: no persistence
        deadline = time.monotonic() + 5
        while quotas.degraded and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            with contextlib.suppress(BackendError):
                await quotas.ping()  # the health probe's call: replays the spend kept here
        assert not quotas.degraded
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
        # The spend kept while it was down was added to the new Redis.
        assert await s.spent(acme.id, today()) == pytest.approx(0.4)


async def test_an_amount_sent_again_with_its_id_is_added_once(url: str) -> None:
    acme, amount = tenant_id("acme"), new_id()
    async with store(url) as s:
        assert await s.add_spend(acme, today(), 0.25, amount) == pytest.approx(0.25)
        assert await s.add_spend(acme, today(), 0.25, amount) == pytest.approx(0.25)
        assert await s.add_spend(acme, today(), 0.5, new_id()) == pytest.approx(0.75)
        assert await s.spent(acme, today()) == pytest.approx(0.75)


async def test_spend_applied_but_its_reply_lost_is_not_counted_twice(
    redis_server: RedisServer,
) -> None:
    """The lost reply for real: Redis paused, the call times out, Redis resumes and runs the
    command it had received; the replay must not add it again."""
    acme = limited(tenant_id("acme"), budget=5.0)
    async with store(redis_server.url) as s:
        quotas = Quotas(s, Metrics(), retry_s=0.1)
        await quotas.record_spend(limited(tenant_id("warm")), 0.01)  # the script is loaded
        redis_server.pause()
        try:
            await quotas.record_spend(acme, 0.3)  # times out: kept here, unconfirmed
        finally:
            redis_server.resume()
        assert quotas.degraded
        for _ in range(60):  # the resumed server runs what it had received
            if await s.spent(acme.id, today()) > 0:
                break
            await asyncio.sleep(0.05)
        assert await s.spent(acme.id, today()) == pytest.approx(0.3)  # it was applied
        await asyncio.sleep(0.1)
        await quotas.ping()  # the replay
        assert not quotas.degraded
        assert await s.spent(acme.id, today()) == pytest.approx(0.3)  # not 0.6
        assert quotas._outbox.outstanding() == {}
        ttl = int(redis_server.command("TTL", applied_key(acme.id, today())).strip().lstrip(b":"))
        assert ttl > 3600  # the ids expire with the day's spend


async def test_one_tenants_corrupt_keys_are_repaired_and_no_other_tenant_is_degraded(
    redis_server: RedisServer,
) -> None:
    bad, good = limited(tenant_id("bad"), budget=1.0), limited(tenant_id("good"), budget=1.0)
    redis_server.command("SET", bucket_key(bad.id), "not a hash")  # WRONGTYPE for HMGET
    redis_server.command("SET", spend_key(bad.id, today()), "garbage")
    redis_server.command("SET", applied_key(bad.id, today()), "not a hash")
    metrics = Metrics()
    async with store(redis_server.url) as s:
        quotas = Quotas(s, metrics, retry_s=60.0)  # a breaker tripped would stay tripped
        await quotas.admit(bad, answering=True)  # decided here; its keys repaired
        await quotas.record_spend(bad, 0.1)
        await quotas.admit(good, answering=True)
        await quotas.record_spend(good, 0.2)
        assert not quotas.degraded
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
        assert await s.spent(good.id, today()) == pytest.approx(0.2)  # shared, at once
        await quotas.ping()  # the probe sends bad's kept spend, now that its keys are fixed
        assert await s.spent(bad.id, today()) == pytest.approx(0.1)
        assert await s.take(bad.id, 0.1, 2) >= 0.0  # the bucket is a hash again
    for key in (bucket_key(bad.id), applied_key(bad.id, today())):
        assert redis_server.command("TYPE", key).strip() in (b"+hash", b"+zset", b"+none")


@pytest.mark.parametrize(("tokens", "ts"), [("1", "nan"), ("5", "inf"), ("-inf", "1")])
async def test_a_bucket_holding_nan_or_inf_starts_afresh(
    redis_server: RedisServer, tokens: str, ts: str
) -> None:
    """Lua's tonumber reads 'nan' and 'inf': a bucket whose ts is one never refilled (the
    tenant was refused for good once its tokens ran out), and tokens of -inf was an error on
    every request that the repair, which only fixes a key of another type, never cleared."""
    acme = tenant_id("acme")
    redis_server.command("HSET", bucket_key(acme), "tokens", tokens, "ts", ts)
    async with store(redis_server.url) as s:
        assert [await s.take(acme, 1.0, 2) for _ in range(2)] == [0.0, 0.0]  # full: the burst
        assert 0.0 < await s.take(acme, 1.0, 2) <= 1.0  # empty: a token within a second
    reply = redis_server.command("HGET", bucket_key(acme), "ts")
    stored = float(reply.split(b"\r\n")[1])
    assert abs(stored - time.time()) < 60  # the server's clock, not the garbage


async def test_a_dead_redis_is_unavailable_not_a_tenants_data_error(
    redis_server: RedisServer,
) -> None:
    async with store(redis_server.url) as s:
        redis_server.kill()
        with pytest.raises(BackendUnavailable):
            await s.spent("acme", today())
        with pytest.raises(BackendUnavailable):
            await s.ping()


@pytest.mark.parametrize("garbage", ["not a number", "inf", "-1"])
async def test_an_unusable_spend_refuses_the_add_before_marking_its_id(
    redis_server: RedisServer, garbage: str
) -> None:
    acme, amount = tenant_id("acme"), new_id()
    redis_server.command("SET", spend_key(acme, today()), garbage)
    async with store(redis_server.url) as s:
        with pytest.raises(UpstreamError):
            await s.add_spend(acme, today(), 0.25, amount)
        await s.repair(acme, today(), 0.5)  # the last total this process read
        assert await s.add_spend(acme, today(), 0.25, amount) == pytest.approx(0.75)  # not lost


def _monitor(server: RedisServer) -> socket.socket:
    """A MONITOR connection: it then receives every command the server runs, one line each,
    a script's own calls marked `lua`."""
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
    assert sock.recv(5) == b"+OK\r\n"
    return sock


def _client_commands(sock: socket.socket) -> list[str]:
    time.sleep(0.2)
    sock.settimeout(0.2)
    raw = b""
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(65536):
            raw += chunk
    lines = raw.decode(errors="replace").splitlines()
    return [line.split("] ", 1)[1] for line in lines if "] " in line and "lua]" not in line]


async def test_a_limited_budgeted_request_is_admitted_in_one_round_trip(
    redis_server: RedisServer,
) -> None:
    """The rate-limit take and the budget read are one script (one tenant's hash tag): a
    request to a tenant with both costs one round trip as it arrives, not two."""
    tenant = TenantConfig.model_validate(
        {
            "id": tenant_id("admit"),
            "api_key_sha256": "0" * 64,
            "rate_limit": {"requests_per_s": 100, "burst": 100},
            "daily_budget_usd": 10.0,
        }
    )
    async with store(redis_server.url) as shared:
        quotas = Quotas(shared, Metrics())
        await quotas.admit(tenant, answering=True)  # loads the script
        monitor = _monitor(redis_server)
        try:
            await quotas.admit(tenant, answering=True)
            commands = _client_commands(monitor)
        finally:
            monitor.close()
    assert len(commands) == 1, commands  # was 2: the take, then a GET of the day's spend
    assert commands[0].startswith('"EVALSHA"')


async def test_a_request_past_its_redis_budget_decides_alone_and_degrades_no_other(
    redis_server: RedisServer,
) -> None:
    """A request that has used its Redis time is decided here, as if Redis were down, but
    Redis answering everyone else is not down: the process stays shared, not degraded."""
    acme = limited(tenant_id("acme"), budget=1.0)
    metrics = Metrics()
    async with store(redis_server.url) as shared:
        quotas = Quotas(shared, metrics)
        spent = RequestSpend(spent_s=10.0)
        # A full bucket: admitted, decided here.
        await quotas.admit(acme, answering=True, spend=spent)
        assert not quotas.degraded
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
        local = Scrape.of(metrics).get("querygate_quota_local_decisions_total", check="rate_limit")
        assert local == 1.0
        await quotas.admit(acme, answering=True)  # the next request asks Redis
        # Of Redis's burst of 2, that one took a token and the first none: one is left.
        assert await shared.take(acme.id, 0.1, 2) == 0.0
        assert await shared.take(acme.id, 0.1, 2) > 0


async def test_a_call_that_waited_out_its_budget_for_a_connection_degrades_no_other(
    redis_server: RedisServer,
) -> None:
    """Every connection of the process busy (a burst past max_connections; here the one
    connection held by a blocking read): a request whose Redis time runs out while it waits
    for one was never sent, and a healthy Redis is not marked down for every tenant."""
    acme = limited(tenant_id("acme"), budget=1.0)
    metrics = Metrics()
    options = replace(RedisOptions(redis_server.url), max_connections=1, request_budget_s=0.1)
    connection = RedisConnection(options)
    await connection.start()
    try:
        quotas = Quotas(RedisQuotaStore(connection), metrics)
        # It holds the only connection for 0.2 s (or to its 0.25 s socket timeout).
        busy = asyncio.create_task(connection.call(connection.client.blpop(["qg:none"], 0.2)))
        await asyncio.sleep(0.02)
        await quotas.check_budget(acme, spend=RequestSpend())  # decided here
        with contextlib.suppress(BackendUnavailable):
            await busy
        assert not quotas.degraded
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
    finally:
        await connection.aclose()


async def test_a_process_started_during_an_outage_refuses_a_budget_it_never_read(
    redis_server: RedisServer,
) -> None:
    """A new process (restart, scale-out, replaced worker) while Redis is down does not know
    the day's spend: it refuses the tenant's budgeted requests until Redis answers, rather
    than counting from nothing and giving a spent tenant a new day's budget."""
    acme = limited(tenant_id("acme"), budget=0.0002)
    free = limited(tenant_id("free"))  # no budget: nothing to know
    async with store(redis_server.url) as first_store:
        first = Quotas(first_store, Metrics(), retry_s=0.2)
        await first.admit(acme, answering=True)
        await first.record_spend(acme, 0.0002)  # the day is spent
        redis_server.kill()
        with pytest.raises(BudgetExceeded):  # the process that read it still knows
            await first.check_budget(acme)
        metrics = Metrics()
        async with store(redis_server.url, timeout_s=0.5) as fresh_store:
            fresh = Quotas(fresh_store, metrics, retry_s=0.2)
            with pytest.raises(BudgetUnknown) as refused:
                await fresh.admit(acme, answering=True)
            assert refused.value.status == 503 and refused.value.retry_after_s == 1
            with pytest.raises(BudgetUnknown):
                await fresh.check_budget(acme)
            await fresh.admit(free, answering=True)  # no budget: answered through the outage
            assert fresh.degraded
            refusals = Scrape.of(metrics).get(
                "querygate_quota_refusals_total", reason="budget_unknown"
            )
            assert refusals == 2.0
            redis_server.start()  # empty: it forgot the day, as a restart without AOF does
            deadline = time.monotonic() + 5
            while fresh.degraded and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                with contextlib.suppress(BackendError):
                    await fresh.ping()
            # Read once: the total is known, and decided on from then on, Redis up or down.
            await fresh.admit(acme, answering=True)
            redis_server.kill()
            await fresh.check_budget(acme)


async def test_a_call_cut_by_its_budget_on_a_healthy_redis_degrades_no_other(
    redis_server: RedisServer,
) -> None:
    """A request whose earlier calls left it 20 us of Redis time has its call cut on a healthy
    Redis (under a burst on a loaded core, 150 requests opening connections overran 0.25 s),
    and its probe runs while the loop stays blocked longer than the budget: Redis is judged
    alone, found answering, and the process stays shared (a cut once put every tenant on
    per-process limits, and budgets it had not read on 503s)."""
    acme = limited(tenant_id("acme"), budget=1.0)
    metrics = Metrics()
    async with store(redis_server.url) as shared:
        quotas = Quotas(shared, metrics)
        await quotas.check_budget(acme)  # the script and connection are warm
        pings = commands_run(redis_server, "ping")
        nearly = RequestSpend(spent_s=0.25 - 2e-5)  # of the default 0.25 s
        await quotas.admit(acme, answering=True, spend=nearly)  # decided here
        hog = asyncio.create_task(block_the_loop(0.1))
        try:
            await quotas.settled()
        finally:
            hog.cancel()
        assert commands_run(redis_server, "ping") > pings  # the probe asked Redis
        assert not quotas.degraded
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 0.0
        local = Scrape.of(metrics).get("querygate_quota_local_decisions_total", check="rate_limit")
        assert local == 1.0


async def block_the_loop(each_s: float) -> None:
    """A loop too busy to read replies: every turn blocks it `each_s`, until cancelled."""
    while True:
        time.sleep(each_s)  # noqa: ASYNC251 - blocking the loop is the point
        await asyncio.sleep(0)


async def test_a_slow_redis_is_found_down_though_each_call_is_within_its_socket_timeout(
    redis_server: RedisServer,
) -> None:
    """A Redis that answers every call, but 0.4 s late (a proxy holds each piece 0.2 s each
    way), with a socket timeout of 2 s: the probe a cut call starts finds it slower than a
    request's 0.25 s budget, so the next requests skip it rather than each spend its budget;
    the health ping keeps it down while it is slow and ends the outage once it is fast."""
    acme = limited(tenant_id("acme"), budget=1.0)
    metrics = Metrics()
    proxy = TcpProxy(f"127.0.0.1:{redis_server.port}")
    proxy.start("slow", delay_ms=200)
    try:
        async with store(f"redis://127.0.0.1:{proxy.port}", timeout_s=2.0) as shared:
            quotas = Quotas(shared, metrics, retry_s=60.0)
            await quotas.admit(acme, answering=True)  # no budget: waits for the slow answer
            await quotas.admit(acme, answering=True, spend=RequestSpend())  # cut, decided here
            await quotas.settled()
            assert quotas.degraded
            assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 1.0
            with pytest.raises(BackendUnavailable, match="longer than a request's Redis budget"):
                await quotas.ping()
            assert quotas.degraded
            proxy.switch("pass")
            await quotas.ping()
            assert not quotas.degraded
    finally:
        proxy.stop()


async def test_a_paused_redis_cut_at_a_requests_budget_is_found_down_by_its_probe(
    redis_server: RedisServer,
) -> None:
    """The request's call is cut at its budget and decided here; the probe it starts times
    out too, so the store is down for the next requests (they skip it, not each wait out
    their budget)."""
    acme = limited(tenant_id("acme"), budget=1.0)
    metrics = Metrics()
    async with store(redis_server.url) as shared:
        quotas = Quotas(shared, metrics, retry_s=60.0)
        await quotas.admit(acme, answering=True)  # the script and connection are warm
        redis_server.pause()
        try:
            await quotas.admit(acme, answering=True, spend=RequestSpend())
            await quotas.settled()
        finally:
            redis_server.resume()
        assert quotas.degraded
        assert Scrape.of(metrics).get("querygate_quota_store_degraded") == 1.0
