import asyncio
import json

import numpy as np
import pytest
from pydantic import ValidationError

from backends.cache.base import CachedEntry, Neighbour
from backends.cache.memory import MemoryCacheStore
from backends.errors import BackendUnavailable
from backends.llm.base import NO_OPTIONS, GenerationOptions, Message
from backends.redis_client import RequestSpend
from backends.retrieval.base import Vector
from gateway.cache.keys import (
    CacheScope,
    answer_config_version,
    exact_key,
    history_digest,
    normalise_query,
    options_digest,
)
from gateway.cache.response import ResponseCache, StoreFailed
from gateway.cache.single_flight import Shared, SingleFlight
from gateway.core.finish import replay_pieces
from gateway.obs.metrics import Metrics
from gateway.settings import CacheConfig, Settings, TenantConfig
from routers.types import Route

SCOPE = CacheScope("auto", 3, "cfg1", "all-MiniLM-L6-v2")


def test_key_ignores_case_spacing_and_closing_mark_but_not_words() -> None:
    a = exact_key(SCOPE, "What is  RRF?")
    assert a == exact_key(SCOPE, "what is rrf")
    assert a != exact_key(SCOPE, "what is not rrf?")
    assert normalise_query("C++?") != normalise_query("C?")


def test_key_separates_every_scope() -> None:
    base = exact_key(SCOPE, "q")
    for changed in (
        CacheScope("lookup", 3, "cfg1", "all-MiniLM-L6-v2"),
        CacheScope("auto", 4, "cfg1", "all-MiniLM-L6-v2"),
        CacheScope("auto", 3, "cfg2", "all-MiniLM-L6-v2"),
        CacheScope("auto", 3, "cfg1", "other-model"),
        CacheScope("auto", 3, "cfg1", "all-MiniLM-L6-v2", prompts_version="p2"),
        CacheScope("auto", 3, "cfg1", "all-MiniLM-L6-v2", payload_version=99),
        CacheScope("auto", 3, "cfg1", "all-MiniLM-L6-v2", options_digest(GenerationOptions(0.2))),
    ):
        assert exact_key(changed, "q") != base
        assert changed.digest != SCOPE.digest


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 2³?", "What is 23?"),  # NFKC folded the superscript
        ("Maße", "Masse"),  # casefold folded ß
        ("What is 10!", "What is 10?"),  # "!" is a factorial, not a closing mark
        ("ﬁle size?", "file size?"),  # a ligature is a compatibility form NFKC folded
    ],
)
def test_the_exact_key_keeps_what_can_change_a_question(a: str, b: str) -> None:
    assert exact_key(SCOPE, a) != exact_key(SCOPE, b)


def test_the_exact_key_folds_width_case_space_and_a_closing_mark_only() -> None:
    assert normalise_query("ＡＢＣ？") == normalise_query("abc")  # noqa: RUF001 (full width)
    assert normalise_query("Café\u00a0 ok.") == normalise_query("cafe\u0301 OK")  # NFC
    assert normalise_query("What is RRF ?") == "what is rrf"


def test_the_conversation_the_model_reads_is_in_the_scope() -> None:
    french = history_digest([Message("system", "Answer only in French")])
    turn = history_digest([Message("user", "About Acme."), Message("assistant", "Sure.")])
    assert history_digest([]) == ""
    assert len({"", french, turn}) == 3
    keys = {exact_key(CacheScope("auto", 3, "cfg1", "m", history=h), "q") for h in ("", french)}
    assert len(keys) == 2


def test_no_options_add_nothing_to_the_scope() -> None:
    assert options_digest(NO_OPTIONS) == ""
    assert options_digest(GenerationOptions(max_tokens=5)) != ""


def _vec(*values: float) -> Vector:
    return np.asarray(values, dtype=np.float32)


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
    assert await store.get("acme", "b") is None  # read at 0 and 9: the TTL was not extended


async def test_memory_store_rewrites_a_tenants_only_entry() -> None:
    store = MemoryCacheStore()
    for payload in (b"1", b"2"):
        await store.put("acme", "s", CachedEntry("k", "q", payload), ttl_s=10, max_entries=5)
    entry = await store.get("acme", "k")
    assert entry is not None and entry.payload == b"2"


async def test_memory_store_nearest_stays_in_its_tenant_and_scope() -> None:
    store = MemoryCacheStore()
    v = _vec(1.0, 0.0, 0.0)
    near = _vec(0.99, 0.1, 0.0)
    for tenant, scope, key in (("acme", "s1", "a"), ("acme", "s2", "b"), ("globex", "s1", "c")):
        entry = CachedEntry(key, "q", b"{}", v)
        await store.put(tenant, scope, entry, ttl_s=10, max_entries=10)
    found = await store.nearest("acme", "s1", near, limit=4)
    assert [n.entry.key for n in found] == ["a"]
    assert 0.99 < found[0].similarity <= 1.0


async def test_memory_store_nearest_scores_a_bounded_candidate_set() -> None:
    store = MemoryCacheStore(tables=4, bits=2, bucket_cap=8)  # 16 buckets of 8 at most
    rng = np.random.default_rng(0)
    for i in range(2_000):
        vector = rng.standard_normal(16).astype(np.float32)
        entry = CachedEntry(f"k{i}", "q", b"{}", vector)
        await store.put("acme", "s", entry, ttl_s=60, max_entries=10_000)
    found = await store.nearest("acme", "s", rng.standard_normal(16).astype(np.float32), 100)
    assert len(found) <= 4 * 8


async def test_memory_store_claim_is_held_until_released_or_expired() -> None:
    now = [0.0]
    store = MemoryCacheStore(clock=lambda: now[0])
    assert await store.claim("acme", "k", ttl_s=5)
    assert not await store.claim("acme", "k", ttl_s=5)
    assert await store.claim("globex", "k", ttl_s=5)  # per tenant
    await store.release("acme", "k")
    assert await store.claim("acme", "k", ttl_s=5)
    now[0] = 5.0
    assert await store.claim("acme", "k", ttl_s=5)  # the lease ended by itself


async def test_memory_store_renews_and_releases_only_its_own_live_claim() -> None:
    now = [0.0]
    store = MemoryCacheStore(clock=lambda: now[0])
    assert not await store.renew("acme", "k", ttl_s=5)  # never claimed
    assert await store.claim("acme", "k", ttl_s=5)
    now[0] = 4.0
    assert await store.renew("acme", "k", ttl_s=5)  # now held until 9
    now[0] = 8.0
    assert not await store.claim("acme", "k", ttl_s=5)
    now[0] = 9.5
    assert not await store.renew("acme", "k", ttl_s=5)  # lapsed: not renewed back to life
    assert await store.claim("acme", "k", ttl_s=5)


async def test_a_closed_memory_store_is_unavailable_not_a_bug() -> None:
    store = MemoryCacheStore()
    await store.aclose()
    with pytest.raises(BackendUnavailable):
        await store.get("acme", "k")
    cache = ResponseCache(store, CacheConfig(), Metrics(), lease_s=5)
    with pytest.raises(StoreFailed):  # served uncached, counted as an error: not a 500
        await cache.exact("acme", "k")


async def test_a_leader_renews_its_short_claim_while_it_computes() -> None:
    store = MemoryCacheStore()
    flights = SingleFlight(store, wait_s=5, lease_s=0.15)

    async def nothing() -> None:
        return None

    lease, _ = await flights.lead("acme", "k", nothing)
    await asyncio.sleep(0.5)  # three leases long: renewed all along
    assert not await store.claim("acme", "k", ttl_s=5)
    await flights.finish(lease, None)
    await asyncio.sleep(0)
    assert lease.renewing is not None and lease.renewing.done()
    assert await store.claim("acme", "k", ttl_s=5)


async def test_a_dead_leaders_claim_lapses_within_a_short_lease() -> None:
    store = MemoryCacheStore()
    cache = ResponseCache(store, CacheConfig(single_flight_wait_s=30), Metrics(), lease_s=300)
    assert cache.flights is not None
    assert cache.flights._lease_s <= 10  # not the request timeout


async def test_a_follower_keeps_half_its_deadline_to_compute_itself() -> None:
    flights = SingleFlight(MemoryCacheStore(), wait_s=30, lease_s=5)
    loop = asyncio.get_running_loop()
    assert 1.9 < flights.budget_s(loop.time() + 4.0) <= 2.0


async def test_a_stale_in_process_lead_is_dropped_not_followed() -> None:
    flights = SingleFlight(MemoryCacheStore(), wait_s=5, lease_s=0.05, stale_s=0.1)

    async def nothing() -> None:
        return None

    lease, _ = await flights.lead("acme", "k", nothing)  # never finished: a leaked lead
    assert flights.leader_of("acme", "k") is lease
    await asyncio.sleep(0.15)
    assert flights.leader_of("acme", "k") is None
    assert lease.future.done() and lease.future.result() is None  # its followers compute
    await flights.finish(lease, None)


async def test_a_neighbour_from_another_scope_is_never_served() -> None:
    store = MemoryCacheStore()
    payload = json.dumps(
        {"answer": "x", "route": "lookup", "citations": [], "extractive": False,
         "escalated": False, "route_reason": "r"}
    ).encode()  # fmt: skip
    # Filed under scope "s1" but keyed for scope "s2": a store mix-up.
    await store.put("acme", "s1", CachedEntry("s2:k", "q", payload, _vec(1.0, 0.0)), ttl_s=60,
                    max_entries=9)  # fmt: skip
    cache = ResponseCache(store, CacheConfig(), Metrics(), lease_s=5)
    found = await cache.semantic("acme", "s1", "q", _vec(1.0, 0.0))
    assert found.nearest is not None and found.payload is None
    await store.put("acme", "s1", CachedEntry("s1:k", "q", payload, _vec(1.0, 0.0)), ttl_s=60,
                    max_entries=9)  # fmt: skip
    found = await cache.semantic("acme", "s1", "q", _vec(1.0, 0.0))
    assert found.payload is not None  # its own scope's entry is


class BrokenStore:
    name = "broken"

    async def get(
        self, tenant: str, key: str, *, spend: RequestSpend | None = None
    ) -> CachedEntry | None:
        raise BackendUnavailable("cache", "connection refused")

    async def nearest(
        self,
        tenant: str,
        scope: str,
        vector: Vector,
        limit: int,
        *,
        spend: RequestSpend | None = None,
    ) -> list[Neighbour]:
        raise BackendUnavailable("cache", "connection refused")

    async def put(
        self, tenant: str, scope: str, entry: CachedEntry, *, ttl_s: int, max_entries: int
    ) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def delete(self, tenant: str, key: str, *, spend: RequestSpend | None = None) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> bool:
        raise BackendUnavailable("cache", "connection refused")

    async def get_or_claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> tuple[CachedEntry | None, bool]:
        raise BackendUnavailable("cache", "connection refused")

    async def abandon(self, tenant: str, key: str) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def renew(self, tenant: str, key: str, ttl_s: float) -> bool:
        raise BackendUnavailable("cache", "connection refused")

    async def release(self, tenant: str, key: str) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def ping(self) -> None:
        raise BackendUnavailable("cache", "connection refused")

    async def aclose(self) -> None:
        return None


async def test_a_failing_store_fails_the_lookup_softly_and_a_put_silently() -> None:
    cache = ResponseCache(BrokenStore(), CacheConfig(), Metrics(), lease_s=5)
    for lookup in (cache.exact("acme", "k"), cache.semantic("acme", "s", "q", _vec(1.0))):
        try:
            await lookup
        except StoreFailed:
            pass
        else:
            raise AssertionError("a failing store must say so")
    await cache.put("acme", "s", "k", "q", {"answer": "x"}, None)  # does not raise


async def test_an_undecodable_answer_is_deleted_and_not_served() -> None:
    store = MemoryCacheStore()
    await store.put("acme", "s", CachedEntry("k", "q", b"{not json"), ttl_s=60, max_entries=9)
    cache = ResponseCache(store, CacheConfig(), Metrics(), lease_s=5)
    assert await cache.exact("acme", "k") is None
    assert await store.get("acme", "k") is None


async def test_single_flight_followers_get_the_leaders_answer_and_one_claim_is_held() -> None:
    store = MemoryCacheStore()
    flights = SingleFlight(store, wait_s=5, lease_s=5)

    async def nothing() -> None:
        return None

    lease, payload = await flights.lead("acme", "k", nothing)
    assert payload is None and lease.claimed
    assert not await store.claim("acme", "k", ttl_s=5)  # the fleet sees the claim
    leader = flights.leader_of("acme", "k")
    assert leader is lease
    followers = [asyncio.create_task(flights.follow(leader)) for _ in range(3)]
    await asyncio.sleep(0)
    await flights.finish(lease, Shared({"answer": "x"}, "exact"))
    assert [(await f).payload for f in followers] == [{"answer": "x"}] * 3  # type: ignore[union-attr]
    assert flights.leader_of("acme", "k") is None
    assert await store.claim("acme", "k", ttl_s=5)  # released


async def test_a_waiter_in_another_process_leads_when_the_claim_comes_free() -> None:
    store = MemoryCacheStore()
    assert await store.claim("acme", "k", ttl_s=5)  # another process leads
    flights = SingleFlight(store, wait_s=2, lease_s=5)

    async def nothing() -> None:
        return None

    async def free_it() -> None:
        await asyncio.sleep(0.1)
        await store.release("acme", "k")  # it stored nothing

    freeing = asyncio.create_task(free_it())
    lease, payload = await flights.lead("acme", "k", nothing)
    await freeing
    assert payload is None and lease.claimed


def test_a_replayed_answer_is_several_pieces_that_join_to_it_exactly() -> None:
    text = "The Eiffel Tower was designed by  Gustave Eiffel's firm [1].\n\nIt opened in 1889 [2]."
    pieces = replay_pieces(text)
    assert len(pieces) > 2
    assert "".join(pieces) == text
    assert replay_pieces("") == [""]


def test_replicas_differing_only_in_port_or_data_dir_share_a_scope() -> None:
    tenant = TenantConfig(id="acme", api_key_sha256=("0" * 64,))
    base = Settings()
    same = Settings(server={"port": 9999}, data_dir="/elsewhere", cache={"ttl_s": 5})
    other = Settings(retrieval={"k": 3})
    assert answer_config_version(base, tenant) == answer_config_version(same, tenant)
    assert answer_config_version(base, tenant) != answer_config_version(other, tenant)
    narrower = TenantConfig(id="acme", api_key_sha256=("1" * 64,), allow_full_context=False)
    assert answer_config_version(base, tenant) != answer_config_version(base, narrower)


def test_semantic_thresholds_are_similarities_and_unnamed_routes_keep_the_default() -> None:
    with pytest.raises(ValidationError, match=r"lookup: a cosine similarity from 0\.5 to 1"):
        Settings(cache={"semantic": {"thresholds": {"lookup": 0.2}}})
    thresholds = Settings(cache={"semantic": {"thresholds": {"lookup": 0.9}}}).cache.semantic
    assert thresholds.thresholds[Route.LOOKUP] == 0.9
    assert thresholds.thresholds[Route.MULTIHOP] == 0.96
