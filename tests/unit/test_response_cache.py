from backends.cache.memory import MemoryCacheStore
from backends.errors import BackendUnavailable
from backends.llm.base import Message
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


async def test_memory_store_expires_and_evicts() -> None:
    now = [0.0]
    store = MemoryCacheStore(max_entries=2, clock=lambda: now[0])
    await store.set("a", b"1", ttl_s=10)
    await store.set("b", b"2", ttl_s=10)
    assert await store.get("a") == b"1"  # a is now the most recent
    await store.set("c", b"3", ttl_s=10)
    assert await store.get("b") is None  # least recently used went first
    now[0] = 11.0
    assert await store.get("a") is None


class BrokenStore:
    name = "broken"

    async def get(self, key: str) -> bytes | None:
        raise BackendUnavailable("cache", "connection refused")

    async def set(self, key: str, value: bytes, ttl_s: int) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def ping(self) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def aclose(self) -> None:
        return None


async def test_a_failing_store_is_a_counted_miss_not_an_error() -> None:
    metrics = Metrics()
    cache = ResponseCache(BrokenStore(), ttl_s=60, metrics=metrics)
    assert await cache.get("k") is None
    await cache.put("k", {"answer": "x"})
    value = metrics.registry.get_sample_value("querygate_cache_lookups_total", {"result": "error"})
    assert value == 1.0
