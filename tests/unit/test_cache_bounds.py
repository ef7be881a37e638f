"""The response cache's bounds: no answer over `cache.max_entry_bytes` is stored, and the memory
store's whole size is capped with eviction fair across tenants, counted as the memory it holds."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from backends.cache.base import CachedEntry
from backends.cache.memory import ENTRY_OVERHEAD_BYTES, MemoryCacheStore
from gateway.cache.response import ResponseCache
from gateway.obs.metrics import Metrics
from gateway.settings import CacheConfig
from tests.metrics import Scrape

PAYLOAD = b"x" * 1000
ENTRY = 3 + 1 + len(PAYLOAD) + ENTRY_OVERHEAD_BYTES  # a three-letter key, one-letter question


def entry(key: str) -> CachedEntry:
    assert len(key) == 3
    return CachedEntry(key, key[0], PAYLOAD)


async def test_one_tenant_filling_the_store_evicts_its_own_oldest_not_the_others() -> None:
    store = MemoryCacheStore(max_bytes=ENTRY * 10)
    for key in ("g01", "g02", "g03"):
        await store.put("globex", "s", entry(key), ttl_s=60, max_entries=100)
    for n in range(50):  # far past the ceiling, well inside the tenant's own cap
        await store.put("acme", "s", entry(f"a{n:02d}"), ttl_s=60, max_entries=100)
    assert store.total_bytes <= ENTRY * 10
    for key in ("g01", "g02", "g03"):
        assert await store.get("globex", key) is not None
    assert await store.get("acme", "a49") is not None  # the newest stays
    assert await store.get("acme", "a00") is None  # the oldest went
    kept = [n for n in range(50) if await store.get("acme", f"a{n:02d}") is not None]
    assert kept == list(range(43, 50))  # 7 of acme's, 3 of globex's: 10 entries


async def test_past_the_ceiling_the_tenant_holding_the_most_loses_first() -> None:
    store = MemoryCacheStore(max_bytes=ENTRY * 4)
    for key in ("a01", "a02", "a03"):
        await store.put("acme", "s", entry(key), ttl_s=60, max_entries=100)
    await store.put("globex", "s", entry("g01"), ttl_s=60, max_entries=100)
    await store.put("globex", "s", entry("g02"), ttl_s=60, max_entries=100)  # globex is newer
    assert await store.get("acme", "a01") is None  # acme held the most: its oldest went
    assert await store.get("globex", "g01") is not None
    await store.delete("acme", "a02")
    await store.delete("acme", "a03")
    assert store.total_bytes == ENTRY * 2  # what leaves is counted off


async def test_an_answer_over_the_entry_cap_is_not_stored_and_is_counted() -> None:
    store, metrics = MemoryCacheStore(), Metrics()
    cache = ResponseCache(store, CacheConfig(max_entry_bytes=4096), metrics, lease_s=5)
    await cache.put("acme", "s", "small", "q", {"answer": "x" * 100}, None)
    await cache.put("acme", "s", "large", "q", {"answer": "x" * 5000}, None)
    await cache.drain()
    assert await store.get("acme", "small") is not None
    assert await store.get("acme", "large") is None
    too_large = Scrape.of(metrics).value("querygate_cache_not_stored_total", reason="too_large")
    assert too_large == 1.0


def question_entry(i: int, payload: int, vector: bool, rng: np.random.Generator) -> CachedEntry:
    return CachedEntry(
        key=f"exact:{i:060d}",
        question=f"what does the guide say about topic number {i}?",
        payload=b"x" * payload,
        vector=rng.standard_normal(384).astype(np.float32) if vector else None,
    )


@pytest.mark.parametrize(
    ("tenants", "payload", "vector"),
    [(1, 2000, True), (50, 2000, True), (2000, 300, True), (50, 6000, False)],
    ids=["one-tenant", "fifty-tenants", "many-small-tenants", "exact-only"],
)
async def test_the_store_counts_the_memory_it_holds(
    tenants: int, payload: int, vector: bool
) -> None:
    """`total_bytes` within 15% of what tracemalloc sees the store hold: the ceiling bounds
    memory, whether a tenant's LSH buckets are shared by many entries or each holds one (an
    entry once cost 2.4 times what was counted)."""
    rng = np.random.default_rng(7)
    store = MemoryCacheStore()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5000):
            entry = question_entry(i, payload, vector, rng)
            await store.put(f"t{i % tenants}", "s", entry, ttl_s=60, max_entries=10**6)
        del entry
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.85 <= store.total_bytes / held <= 1.15, (store.total_bytes, held)


async def test_what_leaves_the_store_is_counted_off_buckets_included() -> None:
    rng = np.random.default_rng(7)
    store = MemoryCacheStore(bucket_cap=2)  # most keys pushed out of a shared bucket too
    for i in range(300):
        await store.put(
            f"t{i % 3}", "s", question_entry(i, 100, True, rng), ttl_s=60, max_entries=100
        )
    assert store.total_bytes > 0
    for i in range(300):
        await store.delete(f"t{i % 3}", f"exact:{i:060d}")
    assert store.total_bytes == 0


async def test_the_gauge_follows_what_the_store_counts() -> None:
    metrics = Metrics()
    store = MemoryCacheStore(on_bytes=metrics.cache_memory_bytes.set)
    gauge = "querygate_cache_memory_bytes"
    assert Scrape.of(metrics).get(gauge) == 0
    for key in ("g01", "g02"):
        await store.put("t", "s", entry(key), ttl_s=60, max_entries=10)
    assert Scrape.of(metrics).get(gauge) == store.total_bytes == ENTRY * 2
    await store.delete("t", "g01")
    assert Scrape.of(metrics).get(gauge) == ENTRY
    await store.aclose()
    assert Scrape.of(metrics).get(gauge) == 0


async def test_the_gauge_follows_evictions_and_vectors_buckets_included() -> None:
    metrics = Metrics()
    rng = np.random.default_rng(11)
    one = MemoryCacheStore()
    await one.put("t", "s", question_entry(0, 500, True, rng), ttl_s=60, max_entries=100)
    size = one.total_bytes  # an entry with its vector and buckets
    store = MemoryCacheStore(max_bytes=size * 5, on_bytes=metrics.cache_memory_bytes.set)
    for i in range(40):  # past the ceiling: the oldest go, their buckets with them
        await store.put("t", "s", question_entry(i, 500, True, rng), ttl_s=60, max_entries=100)
        assert Scrape.of(metrics).get("querygate_cache_memory_bytes") == store.total_bytes
    assert 0 < store.total_bytes <= size * 5
