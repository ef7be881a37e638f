from backends.cache.base import CachedEntry, Neighbour
from backends.cache.memory import MemoryCacheStore
from backends.errors import BackendUnavailable
from backends.llm.base import Message
from backends.retrieval.base import Vector
from gateway.metrics import Metrics
from gateway.response_cache import CacheScope, ResponseCache, cache_key

SCOPE = CacheScope("acme", "auto", 3, "cfg1", "all-MiniLM-L6-v2")


def test_key_ignores_case_and_spacing_but_not_words() -> None:
    a = cache_key(SCOPE, "What is  RRF?", ())
    assert a == cache_key(SCOPE, "what is rrf?", ())
    assert a != cache_key(SCOPE, "what is not rrf?", ())


def test_key_separates_every_scope() -> None:
    base = cache_key(SCOPE, "q", ())
    for changed in (
        CacheScope("other", "auto", 3, "cfg1", "all-MiniLM-L6-v2"),
        CacheScope("acme", "lookup", 3, "cfg1", "all-MiniLM-L6-v2"),
        CacheScope("acme", "auto", 4, "cfg1", "all-MiniLM-L6-v2"),
        CacheScope("acme", "auto", 3, "cfg2", "all-MiniLM-L6-v2"),
        CacheScope("acme", "auto", 3, "cfg1", "other-model"),
    ):
        assert cache_key(changed, "q", ()) != base


def test_key_depends_on_the_conversation() -> None:
    history = (Message("user", "tell me about Paris"),)
    assert cache_key(SCOPE, "and its population?", history) != cache_key(
        SCOPE, "and its population?", ()
    )


async def test_memory_store_expires_and_evicts_the_oldest_of_that_tenant_only() -> None:
    now = [0.0]
    store = MemoryCacheStore(clock=lambda: now[0])
    for key in ("a", "b"):
        await store.put("acme", "s", CachedEntry(key, key, b"1"), ttl_s=10, max_entries=2)
    await store.put("globex", "s", CachedEntry("g", "g", b"1"), ttl_s=10, max_entries=2)
    assert await store.get("acme", "a") is not None  # a read does not make it newer
    await store.put("acme", "s", CachedEntry("c", "c", b"3"), ttl_s=10, max_entries=2)
    assert await store.get("acme", "a") is None  # the oldest went first
    assert await store.get("acme", "b") is not None
    assert await store.get("globex", "g") is not None  # another tenant's entry stays
    now[0] = 10.0
    assert await store.get("acme", "b") is None


class BrokenStore:
    name = "broken"

    async def get(self, tenant: str, key: str) -> CachedEntry | None:
        raise BackendUnavailable("cache", "connection refused")

    async def nearest(self, tenant: str, scope: str, vector: Vector, limit: int) -> list[Neighbour]:
        raise BackendUnavailable("cache", "connection refused")

    async def put(
        self, tenant: str, scope: str, entry: CachedEntry, *, ttl_s: int, max_entries: int
    ) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def delete(self, tenant: str, key: str) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def claim(self, tenant: str, key: str, ttl_s: float) -> bool:
        raise BackendUnavailable("cache", "connection refused")

    async def release(self, tenant: str, key: str) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def ping(self) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def aclose(self) -> None:
        return None


async def test_a_failing_store_is_a_counted_miss_not_an_error() -> None:
    metrics = Metrics()
    cache = ResponseCache(BrokenStore(), ttl_s=60, max_entries=10, metrics=metrics)
    assert await cache.get("acme", "k") is None
    await cache.put("acme", "s", "k", "q", {"answer": "x"})
    value = metrics.registry.get_sample_value("querygate_cache_lookups_total", {"result": "error"})
    assert value == 1.0
