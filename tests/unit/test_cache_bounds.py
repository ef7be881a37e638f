"""The response cache's bounds: no answer over `cache.max_entry_bytes` is stored, and the memory
store's whole size is capped with eviction fair across tenants."""

from __future__ import annotations

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
