"""RedisCacheStore against a real redis-server: a single node and a three-master cluster.

The core cases run on both (`store` is parametrized); the failure cases kill, pause or garble
a single node, and one kills the cluster master that holds a tenant's slot.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from backends.cache.base import CachedEntry, CorruptEntry
from backends.cache.redis import RedisCacheStore
from backends.cache.redis_scripts import lease_key, tenant_keys
from backends.errors import BackendUnavailable
from backends.redis_client import RedisConnection, RedisOptions
from backends.retrieval.base import Vector
from gateway.cache.response import ResponseCache
from gateway.obs.metrics import Metrics
from gateway.settings import CacheConfig
from tests.metrics import Scrape
from tests.redis_server import RedisCluster, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

DIM = 384
SCOPE = "scope-1"
TTL_S = 60
CAP = 1000
BANDS = 12  # RedisCacheStore's default


@dataclass
class Env:
    store: RedisCacheStore
    connection: RedisConnection
    url: str

    def second_store(self) -> RedisCacheStore:
        """Another process's view: its own connection pool and client."""
        return RedisCacheStore(RedisConnection(RedisOptions(self.url)))


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _vector(seed: int) -> Vector:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def _near(vector: Vector, seed: int, noise: float = 0.1) -> Vector:
    """A vector at cosine ~0.995 to `vector` (noise 0.1 per dimension, unit-scale input)."""
    return (vector + noise * np.random.default_rng(seed).standard_normal(DIM)).astype(np.float32)


def _entry(key: str, vector: Vector | None = None, payload: bytes | None = None) -> CachedEntry:
    return CachedEntry(key, f"question {key}", payload or f"answer {key}".encode(), vector)


async def _put(
    store: RedisCacheStore,
    tenant: str,
    entry: CachedEntry,
    *,
    ttl_s: int = TTL_S,
    cap: int = CAP,
    scope: str = SCOPE,
) -> None:
    await store.put(tenant, scope, entry, ttl_s=ttl_s, max_entries=cap)


def _raw(env: Env) -> Any:
    """The store's own client, for writing what the store never would (redis-py's types
    refuse bytes where Redis takes them)."""
    return env.connection.client


async def _open(url: str) -> AsyncIterator[Env]:
    connection = RedisConnection(RedisOptions(url))
    await connection.start()
    store = RedisCacheStore(connection)
    try:
        yield Env(store, connection, url)
    finally:
        await store.aclose()
        await connection.aclose()


@pytest_asyncio.fixture(params=["single", "cluster"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    if request.param == "single":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        url = cluster.urls[0].replace("redis://", "redis+cluster://")
    async for opened in _open(url):
        yield opened


@pytest_asyncio.fixture
async def single(redis_server: RedisServer) -> AsyncIterator[Env]:
    async for opened in _open(redis_server.url):
        yield opened


# -- the core contract, on a single node and on a cluster ------------------------------------


async def test_put_then_get_returns_the_entry(env: Env) -> None:
    tenant, vector = _tenant(), _vector(1)
    await _put(env.store, tenant, _entry("k1", vector))
    got = await env.store.get(tenant, "k1")
    assert got is not None
    assert (got.key, got.question, got.payload) == ("k1", "question k1", b"answer k1")
    assert got.vector is not None
    unit = vector / np.linalg.norm(vector)
    assert float(np.dot(got.vector, unit)) > 0.999  # stored as float16, unit length
    assert await env.store.get(tenant, "absent") is None


async def test_put_again_replaces_the_entry(env: Env) -> None:
    tenant = _tenant()
    await _put(env.store, tenant, _entry("k", _vector(1), b"old"))
    await _put(env.store, tenant, _entry("k", _vector(2), b"new"))
    got = await env.store.get(tenant, "k")
    assert got is not None and got.payload == b"new"
    # the old entry's LSH members went with it: one member per band is left
    assert await _raw(env).zcard(tenant_keys(tenant)[7]) == BANDS


async def test_nearest_finds_the_paraphrase_best_first_within_the_scope(env: Env) -> None:
    tenant = _tenant()
    vectors = {f"k{i}": _vector(i) for i in range(20)}
    for key, vector in vectors.items():
        await _put(env.store, tenant, _entry(key, vector))
    await _put(env.store, tenant, _entry("x", vectors["k7"]), scope="other-scope")
    found = await env.store.nearest(tenant, SCOPE, _near(vectors["k7"], seed=99), limit=3)
    assert found, "a near-duplicate must be found"
    assert found[0].entry.key == "k7"
    assert found[0].similarity > 0.99
    assert all(n.entry.key != "x" for n in found)  # another scope never answers
    assert [n.similarity for n in found] == sorted((n.similarity for n in found), reverse=True)
    assert len(found) <= 3


async def test_an_entry_without_a_vector_is_found_by_key_only(env: Env) -> None:
    tenant = _tenant()
    await _put(env.store, tenant, _entry("plain"))
    assert await env.store.get(tenant, "plain") is not None
    assert await env.store.nearest(tenant, SCOPE, _vector(3), limit=3) == []


async def test_same_key_and_scope_under_two_tenants_stay_apart(env: Env) -> None:
    a, b, vector = _tenant(), _tenant(), _vector(5)
    await _put(env.store, a, _entry("same", vector, b"A's answer"))
    await _put(env.store, b, _entry("same", vector, b"B's answer"))
    got_a, got_b = await env.store.get(a, "same"), await env.store.get(b, "same")
    assert got_a is not None and got_a.payload == b"A's answer"
    assert got_b is not None and got_b.payload == b"B's answer"
    near_b = await env.store.nearest(b, SCOPE, vector, limit=5)
    assert [n.entry.payload for n in near_b] == [b"B's answer"]
    await env.store.delete(a, "same")
    assert await env.store.get(a, "same") is None
    assert await env.store.get(b, "same") is not None


async def test_cap_evicts_the_oldest_of_that_tenant_only(env: Env) -> None:
    quiet, busy = _tenant(), _tenant()
    for i in range(5):
        await _put(env.store, quiet, _entry(f"q{i}", _vector(100 + i)), cap=5)
    for i in range(12):
        await _put(env.store, busy, _entry(f"b{i}", _vector(200 + i)), cap=3)
    busy_left = [i for i in range(12) if await env.store.get(busy, f"b{i}") is not None]
    assert busy_left == [9, 10, 11]
    assert all([await env.store.get(quiet, f"q{i}") is not None for i in range(5)])
    # an evicted entry is gone from the semantic tier and the insertion order too
    assert await _raw(env).zcard(tenant_keys(busy)[7]) == 3 * BANDS
    assert await _raw(env).zcard(tenant_keys(busy)[5]) == 3


async def test_hits_never_extend_the_ttl(env: Env) -> None:
    tenant, vector = _tenant(), _vector(8)
    # A long-lived neighbour keeps the tenant's keys alive: the short entry's own TTL is tested.
    await _put(env.store, tenant, _entry("long", _vector(18)))
    await _put(env.store, tenant, _entry("short", vector), ttl_s=1, cap=CAP)
    written = time.monotonic()
    while time.monotonic() - written < 0.7:  # hit it over and over, by key and by vector
        assert await env.store.get(tenant, "short") is not None
        assert await env.store.nearest(tenant, SCOPE, vector, limit=1)
        await asyncio.sleep(0.1)
    # A TTL refreshed by the last hit (at ~0.7 s) would keep it until ~1.7 s.
    await asyncio.sleep(max(0.0, 1.25 - (time.monotonic() - written)))
    assert await env.store.get(tenant, "short") is None
    assert all(n.entry.key != "short" for n in await env.store.nearest(tenant, SCOPE, vector, 2))
    assert await env.store.get(tenant, "long") is not None


async def test_claim_is_held_by_one_client_and_released_only_by_it(env: Env) -> None:
    tenant, other = _tenant(), env.second_store()
    try:
        assert await env.store.claim(tenant, "k", ttl_s=30)
        assert not await other.claim(tenant, "k", ttl_s=30)
        await other.release(tenant, "k")  # not its lease: must not free it
        assert not await other.claim(tenant, "k", ttl_s=30)
        await env.store.release(tenant, "k")
        assert await other.claim(tenant, "k", ttl_s=30)
    finally:
        await other.aclose()
        await other._connection.aclose()


async def test_an_expired_claim_is_taken_over_and_the_old_owner_cannot_release_it(env: Env) -> None:
    tenant, other = _tenant(), env.second_store()
    try:
        assert await env.store.claim(tenant, "k", ttl_s=0.2)
        await asyncio.sleep(0.35)
        assert await other.claim(tenant, "k", ttl_s=30)
        await env.store.release(tenant, "k")  # its lease expired; the new one is not its own
        assert not await env.store.claim(tenant, "k", ttl_s=30)
    finally:
        await other.aclose()
        await other._connection.aclose()


async def test_a_claim_is_renewed_only_by_its_owner_and_only_while_it_holds(env: Env) -> None:
    tenant, other = _tenant(), env.second_store()
    try:
        assert not await other.renew(tenant, "k", ttl_s=30)  # never claimed
        # Lease and sleeps wide apart: a loaded CI machine can stall the loop for 100s of ms.
        assert await env.store.claim(tenant, "k", ttl_s=1.0)
        assert not await other.renew(tenant, "k", ttl_s=30)  # not its lease
        for _ in range(3):
            await asyncio.sleep(0.4)
            assert await env.store.renew(tenant, "k", ttl_s=1.0)  # outlives its first TTL
        assert not await other.claim(tenant, "k", ttl_s=30)
        await asyncio.sleep(1.5)  # no renewal: it lapses
        assert await other.claim(tenant, "k", ttl_s=30)
        assert not await env.store.renew(tenant, "k", ttl_s=30)  # the new one is not its own
        assert not await env.store.claim(tenant, "k", ttl_s=30)
    finally:
        await other.aclose()
        await other._connection.aclose()


async def test_a_corrupt_entry_is_deleted_and_never_served(env: Env) -> None:
    tenant = _tenant()
    await _put(env.store, tenant, _entry("bad", _vector(9)))
    raw = _raw(env)
    entry_id = await raw.hget(tenant_keys(tenant)[1], "bad")
    await raw.hset(tenant_keys(tenant)[2], entry_id, b"\x00garbage")
    with pytest.raises(CorruptEntry):
        await env.store.get(tenant, "bad")
    assert await env.store.get(tenant, "bad") is None
    assert await raw.hget(tenant_keys(tenant)[2], entry_id) is None


async def test_a_corrupt_vector_is_deleted_on_lookup(env: Env) -> None:
    tenant, vector = _tenant(), _vector(10)
    await _put(env.store, tenant, _entry("badvec", vector))
    raw = _raw(env)
    entry_id = await raw.hget(tenant_keys(tenant)[1], "badvec")
    await raw.hset(tenant_keys(tenant)[3], entry_id, b"odd")
    with pytest.raises(CorruptEntry):
        await env.store.nearest(tenant, SCOPE, vector, limit=1)
    assert await env.store.nearest(tenant, SCOPE, vector, limit=1) == []
    assert await env.store.get(tenant, "badvec") is None


async def test_nearest_scores_a_bounded_candidate_set(env: Env) -> None:
    """2,000 entries in one scope, all near one another (a tenant's questions are): the
    lookup reads at most its bounded candidate set, not the tenant's entries."""
    tenant = _tenant()
    base = _vector(11)
    for i in range(2000):
        await _put(env.store, tenant, _entry(f"k{i}", _near(base, seed=i, noise=0.6)), cap=10_000)
    found = await env.store.nearest(tenant, SCOPE, base, limit=4)
    assert len(found) == 4
    assert 0 < env.store.last_candidates <= env.store.max_candidates < 2000


# -- failure: down, slow, garbage ------------------------------------------------------------


def not_hung(connection: RedisConnection) -> float:
    """Seconds past which a failing call hung: ten times its bound. The bound itself is the
    code's (op_timeout_s); how far past it a loaded core answers is not asserted."""
    return 10 * connection.options.op_timeout_s


async def test_killed_redis_is_unavailable_within_the_timeout_and_recovers(
    redis_server: RedisServer, single: Env
) -> None:
    tenant = _tenant()
    await _put(single.store, tenant, _entry("k", _vector(1)))
    redis_server.kill()
    bound = not_hung(single.connection)
    for operation in (
        single.store.get(tenant, "k"),
        single.store.nearest(tenant, SCOPE, _vector(1), limit=1),
        single.store.put(tenant, SCOPE, _entry("k2"), ttl_s=TTL_S, max_entries=CAP),
        single.store.claim(tenant, "k", ttl_s=5),
        single.store.ping(),
    ):
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await operation
        assert time.monotonic() - started < bound
    redis_server.restart()  # empty (no persistence); the same store must work again
    await single.store.ping()
    await _put(single.store, tenant, _entry("k", _vector(1)))
    assert await single.store.get(tenant, "k") is not None  # scripts are loaded again
    assert await single.store.nearest(tenant, SCOPE, _vector(1), limit=1)


async def test_a_redis_that_never_answers_times_out(redis_server: RedisServer, single: Env) -> None:
    tenant = _tenant()
    await _put(single.store, tenant, _entry("k"))
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as failure:
            await single.store.get(tenant, "k")
        assert time.monotonic() - started < not_hung(single.connection)
        assert "Timeout" in str(failure.value) or "no answer within" in str(failure.value)
    finally:
        redis_server.resume()
    got = await single.store.get(tenant, "k")  # the timed-out connection was dropped, not reused
    assert got is not None and got.key == "k"


async def _garble(env: Env, tenant: str) -> None:
    """Overwrite each of the tenant's cache keys with a string (another writer's mistake)."""
    raw = _raw(env)
    for name in tenant_keys(tenant)[1:]:
        await raw.delete(name)
        await raw.set(name, "not a hash nor a zset")


async def test_a_key_of_the_wrong_type_is_an_error_then_the_tenant_starts_afresh(
    single: Env,
) -> None:
    tenant, other = _tenant(), _tenant()
    await _put(single.store, other, _entry("k"))
    for operation in ("get", "nearest", "put"):
        await _put(single.store, tenant, _entry("k", _vector(1)))
        await _garble(single, tenant)
        with pytest.raises(BackendUnavailable):
            if operation == "get":
                await single.store.get(tenant, "k")
            elif operation == "nearest":
                await single.store.nearest(tenant, SCOPE, _vector(1), limit=1)
            else:
                await _put(single.store, tenant, _entry("k2"))
        # the garbled keys were dropped: the tenant's cache works again, empty
        assert await single.store.get(tenant, "k") is None
        await _put(single.store, tenant, _entry("k", _vector(1)))
        assert await single.store.get(tenant, "k") is not None
        assert await single.store.nearest(tenant, SCOPE, _vector(1), limit=1)
    assert await single.store.get(other, "k") is not None  # nobody else's cache was touched


async def test_a_lease_key_written_by_someone_else_is_never_taken_or_deleted(single: Env) -> None:
    tenant = _tenant()
    raw = _raw(single)
    await raw.set(lease_key(tenant, "k"), "someone else's", px=60_000)
    assert not await single.store.claim(tenant, "k", ttl_s=5)
    await single.store.release(tenant, "k")
    assert await raw.get(lease_key(tenant, "k")) == b"someone else's"


async def test_a_server_speaking_garbage_is_unavailable(tmp_path: object) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"\xff\xfe this is not RESP \r\n")
        await writer.drain()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = RedisConnection(RedisOptions(f"redis://127.0.0.1:{port}/0"))
    store = RedisCacheStore(connection)
    try:
        with pytest.raises(BackendUnavailable):
            await store.get("t", "k")
        with pytest.raises(BackendUnavailable):
            await store.ping()
    finally:
        await connection.aclose()
        server.close()
        await server.wait_closed()


async def test_a_closed_store_refuses_use(single: Env) -> None:
    await single.store.aclose()
    await single.store.aclose()  # idempotent
    with pytest.raises(BackendUnavailable):
        await single.store.get(_tenant(), "k")


async def test_cluster_master_killed_then_restarted(redis_cluster: RedisCluster) -> None:
    """Last in the module: it takes down the master holding one tenant's slot."""
    url = redis_cluster.urls[0].replace("redis://", "redis+cluster://")
    async for opened in _open(url):
        tenant = _tenant()
        await _put(opened.store, tenant, _entry("k", _vector(1)))
        slot = int(redis_cluster.nodes[0].command("CLUSTER", "KEYSLOT", tenant_keys(tenant)[0])[1:])
        owner = _owner(redis_cluster, slot)
        redis_cluster.nodes[owner].kill()
        with pytest.raises(BackendUnavailable):
            await opened.store.get(tenant, "k")
        redis_cluster.restart(owner)
        deadline = time.monotonic() + 10
        while True:  # the client re-reads the slot map by itself
            try:
                await _put(opened.store, tenant, _entry("k", _vector(1)))
                break
            except BackendUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        assert await opened.store.get(tenant, "k") is not None


def _owner(cluster: RedisCluster, slot: int) -> int:
    """Index of the master serving `slot`, read from CLUSTER NODES ("... connected 0-5460")."""
    table = cluster.nodes[0].command("CLUSTER", "NODES").decode()
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 9 or "master" not in fields[2]:
            continue
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        for span in fields[8:]:
            low, _, high = span.partition("-")
            if low.isdigit() and int(low) <= slot <= int(high or low):
                return next(i for i, n in enumerate(cluster.nodes) if n.port == port)
    raise AssertionError(f"no master serves slot {slot}")


async def test_an_answer_over_the_entry_cap_never_reaches_redis(single: Env) -> None:
    """`cache.max_entry_bytes` holds on the shared store too: the write is never sent."""
    metrics = Metrics()
    cache = ResponseCache(single.store, CacheConfig(max_entry_bytes=4096), metrics, lease_s=5)
    tenant = _tenant()
    await cache.put(tenant, SCOPE, "small", "q", {"answer": "x" * 100}, None)
    await cache.put(tenant, SCOPE, "large", "q", {"answer": "x" * 5000}, None)
    await cache.drain()
    assert await single.store.get(tenant, "small") is not None
    assert await single.store.get(tenant, "large") is None
    too_large = Scrape.of(metrics).value("querygate_cache_not_stored_total", reason="too_large")
    assert too_large == 1.0
