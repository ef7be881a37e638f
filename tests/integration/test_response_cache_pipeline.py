"""The response cache in process: the real pipeline over a real embedded index with the suite's
documents, the real MiniLM embedder, litellm's client path to the fake upstream, and each real
store (the in-process one and RedisCacheStore on a throwaway redis-server). Model calls are
counted at the fake upstream by directive key."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from backends.cache.base import CachedEntry, CacheStore
from backends.cache.memory import MemoryCacheStore
from backends.cache.redis import RedisCacheStore
from backends.embeddings.minilm import MiniLMEmbedder
from backends.errors import UpstreamError
from backends.llm.base import Message
from backends.llm.tiers import LiteLLMTiers
from backends.redis_client import RedisConnection, RedisOptions
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.core.pipeline import Pipeline
from gateway.core.request import QueryRequest, RequestContext
from gateway.core.result import QueryResult
from gateway.core.services import Services
from gateway.http.streaming import release_abandoned
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import read_paths
from gateway.obs.metrics import Metrics
from gateway.settings import Settings, TenantConfig
from routers.classifier import HeuristicClassifier
from tests.fixtures.gateway import DATA
from tests.fixtures.upstream import calls_for
from tests.metrics import Scrape
from tests.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

ACME = TenantConfig(id="acme", api_key_sha256=("0" * 64,))
GLOBEX = TenantConfig(id="globex", api_key_sha256=("1" * 64,))
# Low on purpose in most tests: a pair above it is refused by a guard or by nothing.
LOW = 0.5


@pytest.fixture(scope="module")
async def index(
    minilm: MiniLMEmbedder, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[EmbeddedRetriever]:
    retriever = EmbeddedRetriever(tmp_path_factory.mktemp("cache") / "index.sqlite3")
    for tenant in ("acme", "globex"):
        await ingest_documents(tenant, list(read_paths([DATA / tenant])), minilm, retriever)
    yield retriever
    await retriever.aclose()


@pytest.fixture(params=["memory", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[CacheStore, RedisServer | None]]:
    if request.param == "memory":
        yield MemoryCacheStore(), None
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    connection = RedisConnection(RedisOptions(server.url, socket_timeout_s=0.2))
    await connection.start()
    yield RedisCacheStore(connection), server
    await connection.aclose()


Build = Callable[..., Pipeline]


@pytest.fixture
async def build(
    fake_upstream: str,
    minilm: MiniLMEmbedder,
    index: EmbeddedRetriever,
    store: tuple[CacheStore, RedisServer | None],
) -> AsyncIterator[Build]:
    tiers: list[LiteLLMTiers] = []
    metrics = Metrics()

    def make(threshold: float = LOW, lean_http: bool = True, **cache: Any) -> Pipeline:
        tier = {"api_base": fake_upstream, "retries": 0, "input_cost_per_token": 1e-6}
        semantic = {"thresholds": {r: threshold for r in ("direct", "lookup", "multihop")}}
        s = Settings(
            models={
                "small": {"model": "openai/fake-small", **tier},
                "large": {"model": "openai/fake-large", **tier},
            },
            cache={"backend": "memory", "semantic": semantic, **cache},
        )
        llm = LiteLLMTiers(s.models.small, s.models.large, lean_http=lean_http)
        tiers.append(llm)
        services = Services(minilm, index, llm, store[0], metrics)
        return Pipeline(services, s, HeuristicClassifier())

    yield make
    for llm in tiers:
        await llm.aclose()


def req(text: str, tenant: TenantConfig = ACME, **kw: Any) -> QueryRequest:
    return QueryRequest(id=uuid.uuid4().hex, tenant=tenant, query=text, route="lookup", **kw)


def scripted(text: str, **directive: Any) -> str:
    return f"{text} [[fake:{json.dumps(directive)}]]"


async def ask(pipeline: Pipeline, request: QueryRequest) -> QueryResult:
    result = await pipeline.complete(await pipeline.prepare(request))
    # The answer is stored (and its claim released) by a task the answer does not wait for.
    await pipeline._cache.response.drain()
    return result


async def streamed(pipeline: Pipeline, request: QueryRequest) -> tuple[list[str], QueryResult]:
    parts: list[str] = []
    result: QueryResult | None = None
    async for item in pipeline.stream(await pipeline.prepare(request)):
        if isinstance(item, str):
            parts.append(item)
        else:
            result = item
    assert result is not None
    return parts, result


def sample(pipeline: Pipeline, name: str, labels: dict[str, str] | None = None) -> float:
    return Scrape.of(pipeline._s.metrics).get(name, **(labels or {})) or 0.0


def unique(text: str) -> str:
    """The question made new for this test (a word no other test's question has)."""
    return f"{text} (case {uuid.uuid4().hex[:6]})"


async def test_an_exact_repeat_is_served_without_a_model_call(build: Build) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    text = scripted("How do I fix ERR-4471 on the Acme router?", key=key)
    first = await ask(pipeline, req(text))
    again = await ask(pipeline, req("  " + text.replace("How do I", "how  do i") + " "))
    assert (first.cache, again.cache) == ("miss", "exact")
    assert again.answer.text == first.answer.text
    assert again.answer.citations == first.answer.citations
    assert again.answer.usage_by_tier == {}
    assert await calls_for(pipeline.settings.models.small.api_base or "", key) == 1


async def test_a_paraphrase_is_a_semantic_hit_that_costs_nothing(build: Build) -> None:
    pipeline = build(threshold=0.95)
    first = await ask(pipeline, req("How do I fix ERR-4471 on the router?"))
    hit = await ask(pipeline, req("How can I fix ERR-4471 on the router?"))
    assert first.cache == "miss" and first.answer.citations
    assert hit.cache == "semantic"
    assert hit.answer.text == first.answer.text
    assert hit.answer.citations == first.answer.citations
    assert hit.answer.usage_by_tier == {}
    assert hit.cache_debug is not None and hit.cache_debug["similarity"] > 0.95
    assert hit.cache_debug["cached_question"] == "How do I fix ERR-4471 on the router?"
    assert sample(pipeline, "querygate_cache_lookups_total", {"result": "semantic"}) == 1
    assert sample(pipeline, "querygate_cache_nearest_similarity_count") >= 1


async def test_below_the_routes_threshold_is_a_miss_that_records_its_similarity(
    build: Build,
) -> None:
    pipeline = build(threshold=0.99)
    await ask(pipeline, req("How long does the Acme warranty last?"))
    near = await ask(pipeline, req("What is the duration of the Acme warranty?"))  # 0.93
    assert near.cache == "miss"
    assert near.cache_debug is not None
    assert 0.85 < near.cache_debug["nearest_similarity"] < 0.99
    assert sample(pipeline, "querygate_cache_nearest_similarity_bucket", {"le": "0.99"}) >= 1


@pytest.mark.parametrize(
    ("cached", "asked", "guard"),
    [
        (
            "What does the Acme warranty cover?",
            "What does the Acme warranty not cover?",
            "negation",
        ),
        ("Acme warranty terms in 2024?", "Acme warranty terms in 2025?", "numbers"),
        ("Acme warranty claims in March?", "Acme warranty claims in April?", "dates"),
        ("Fix ERR-4471 on the router?", "Fix ERR-4472 on the router?", "numbers"),
        (
            "Where is part SKU_RED_XL stocked on the Acme shelf?",
            "Where is part SKU_BLUE_XL stocked on the Acme shelf?",
            "identifiers",
        ),
        ("Who makes the Acme router?", "Who makes the Acme Nova router?", "entities"),
        ("What is the largest Acme router?", "What is the smallest Acme router?", "comparison"),
    ],
)
async def test_each_guard_refuses_a_near_question_that_asks_something_else(
    build: Build, cached: str, asked: str, guard: str
) -> None:
    pipeline = build(threshold=LOW)
    await ask(pipeline, req(cached))
    result = await ask(pipeline, req(asked))
    assert result.cache == "miss"
    assert result.cache_debug is not None
    assert result.cache_debug["nearest_similarity"] >= LOW  # only the guard stood in the way
    assert guard in result.cache_debug["refused_by"]
    assert sample(pipeline, "querygate_cache_guard_refusals_total", {"guard": guard}) >= 1


@pytest.mark.parametrize(
    ("cached", "asked"),
    [
        ("ราคาเท่าไหร่", "ประเทศไทยอยู่ที่ไหน"),  # Thai
        ("ሰላም እንዴት ነህ", "ቡና የት ነው"),  # Amharic
        ("🍕🍔", "🚗➡️🏠"),  # emoji only
    ],
)
async def test_a_question_its_tokenizer_does_not_know_is_cached_exactly_only(
    build: Build, minilm: MiniLMEmbedder, cached: str, asked: str
) -> None:
    window = minilm.token_window
    assert window.unknown is not None and window.unknown(asked) > 0
    pipeline = build()  # a threshold of 0.5: nearly any neighbour would do
    tag = uuid.uuid4().hex[:6]
    assert (await ask(pipeline, req(f"{cached} {tag}"))).cache == "miss"
    second = await ask(pipeline, req(f"{asked} {tag}"))
    assert second.cache == "miss"
    assert second.cache_debug == {"lookup": "miss"}  # not even looked up semantically
    assert (await ask(pipeline, req(f"{cached} {tag}"))).cache == "exact"


async def test_another_tenant_never_gets_the_answer_even_for_the_identical_question(
    build: Build,
) -> None:
    pipeline = build(threshold=LOW)
    text = unique("What does the warranty cover?")
    await ask(pipeline, req(text, ACME))
    other = await ask(pipeline, req(text, GLOBEX))
    assert other.cache == "miss"
    assert other.cache_debug is not None and other.cache_debug["nearest_similarity"] is None
    assert not {c.doc_id for c in other.answer.citations} & {"errors.md", "warranty.txt"}


async def test_concurrent_identical_misses_make_one_model_call(build: Build) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    text = scripted("How do I fix ERR-5120 on the Acme router?", key=key, delay_ms=800)
    results = await asyncio.gather(*(ask(pipeline, req(text)) for _ in range(6)))
    assert await calls_for(pipeline.settings.models.small.api_base or "", key) == 1
    assert sorted(r.cache for r in results) == ["exact"] * 5 + ["miss"]
    assert len({r.answer.text for r in results}) == 1


async def test_a_waiter_computes_itself_when_the_leader_has_nothing_to_share(
    build: Build,
) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    # The model says the documents do not say: an answer never stored, so never shared.
    directive = {"key": key, "delay_ms": 300, "answer": "The documents do not say."}
    text = f"What is Acme's policy on lunar shipping? [[fake:{json.dumps(directive)}]]"
    results = await asyncio.gather(*(ask(pipeline, req(text)) for _ in range(3)))
    assert [r.cache for r in results] == ["miss"] * 3
    assert await calls_for(pipeline.settings.models.small.api_base or "", key) == 3


async def test_no_cache_answers_afresh_and_still_stores(build: Build) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    text = scripted("How long does an Acme replacement take to ship?", key=key)
    await ask(pipeline, req(text))
    fresh = await ask(pipeline, req(text, cache_lookup=False))
    assert fresh.cache == "miss"
    assert fresh.cache_debug == {"lookup": "bypass"}
    assert await calls_for(pipeline.settings.models.small.api_base or "", key) == 2
    assert (await ask(pipeline, req(text))).cache == "exact"
    nostore = scripted(unique("How long does an Acme replacement take?"), key=key)
    await ask(pipeline, req(nostore, cache_store=False))
    assert (await ask(pipeline, req(nostore))).cache == "miss"


async def test_a_streamed_answer_is_stored_when_complete_and_replayed_as_a_stream(
    build: Build,
) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    answer = "Renew the certificate, then run acme-cli reload on the router {cite:1}. It clears."
    text = scripted("How do I clear ERR-4471 on an Acme router?", key=key, answer=answer)
    _, first = await streamed(pipeline, req(text))
    assert first.cache == "miss" and first.answer.citations
    replay, again = await streamed(pipeline, req(text))
    assert again.cache == "exact"
    assert len(replay) > 1  # pieces, as a stream, not one blob
    assert "".join(replay) == again.answer.text == first.answer.text
    assert (await ask(pipeline, req(text))).cache == "exact"  # and for the JSON path
    assert await calls_for(pipeline.settings.models.small.api_base or "", key) == 1


async def test_a_stream_that_fails_midway_is_not_stored(build: Build) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    text = scripted("Why does ERR-5120 happen on Acme routers?", key=key, truncate_after=2)
    with pytest.raises(Exception):  # noqa: B017 (the upstream's cut, whatever its class)
        await streamed(pipeline, req(text))
    retry = await ask(pipeline, req(text))  # the fault cuts streams only
    assert retry.cache == "miss"


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "litellm"])
async def test_a_stream_cut_cleanly_without_a_finish_is_not_stored(
    build: Build, lean: bool
) -> None:
    pipeline = build(lean_http=lean)
    key = uuid.uuid4().hex
    answer = "It {cite:1} happens when the link drops, and then the router restarts."
    text = scripted("Why does ERR-5121 happen?", key=key, eof_after=3, answer=answer)
    if lean:
        parts, first = await streamed(pipeline, req(text))
        assert parts and first.cache == "miss"  # served as it came
    else:  # litellm's stream wrapper fails such a stream itself
        with pytest.raises(UpstreamError, match="before a finish_reason"):
            await streamed(pipeline, req(text))
    again = await ask(pipeline, req(text))  # the directive cuts streams only
    assert again.cache == "miss"  # never stored as a whole answer


async def test_a_follow_up_is_cached_only_in_its_rewritten_form(build: Build) -> None:
    pipeline = build(threshold=0.999)
    history = (
        Message("user", "Tell me about the Acme warranty."),
        Message("assistant", "It is a limited warranty."),
    )
    standalone = unique("How many years does the Acme warranty last?")
    follow = f"and how long does it last? [[fake:{json.dumps({'answer': standalone})}]]"
    first = await ask(pipeline, req(follow, history=history))
    assert first.query == standalone  # rewritten by the (scripted) small model
    assert first.cache == "miss"
    assert (await ask(pipeline, req(standalone))).cache == "exact"


async def test_an_earlier_turn_or_a_system_message_is_in_the_key(build: Build) -> None:
    pipeline = build(threshold=0.999)
    text = unique("What does the Acme warranty cover?")
    french = (Message("system", "Answer only in French."),)
    turn = (Message("user", "I bought an Acme router."), Message("assistant", "Noted."))
    assert (await ask(pipeline, req(text))).cache == "miss"
    assert (await ask(pipeline, req(text, history=french))).cache == "miss"
    assert (await ask(pipeline, req(text, history=turn))).cache == "miss"
    assert (await ask(pipeline, req(text, history=french))).cache == "exact"
    assert (await ask(pipeline, req(text, history=turn))).cache == "exact"


async def test_a_rewritten_follow_up_is_shared_across_conversations_with_its_system_message(
    build: Build,
) -> None:
    pipeline = build(threshold=0.999)
    french = Message("system", "Answer only in French.")
    standalone = unique("How many years does the Acme warranty last?")
    follow = f"and how long does it last? [[fake:{json.dumps({'answer': standalone})}]]"
    one = (french, Message("user", "Tell me about the Acme warranty."), Message("assistant", "Ok."))
    two = (french, Message("user", "What is the Acme warranty?"), Message("assistant", "A plan."))
    assert (await ask(pipeline, req(follow, history=one))).cache == "miss"
    assert (await ask(pipeline, req(follow, history=two))).cache == "exact"
    assert (await ask(pipeline, req(standalone, history=(french,)))).cache == "exact"
    assert (await ask(pipeline, req(standalone))).cache == "miss"  # without the system message


async def test_a_follow_up_that_was_not_rewritten_is_never_cached(
    fake_upstream: str, minilm: MiniLMEmbedder, index: EmbeddedRetriever
) -> None:
    tier = {"api_base": fake_upstream, "retries": 0}
    s = Settings(
        models={"small": {"model": "openai/fake-small", **tier}},
        cache={"backend": "memory"},
        router={"rewrite_followups": False},
    )
    llm = LiteLLMTiers(s.models.small, None)
    pipeline = Pipeline(
        Services(minilm, index, llm, MemoryCacheStore(), Metrics()), s, HeuristicClassifier()
    )
    history = (Message("user", "Tell me about ERR-4471."), Message("assistant", "A cert error."))
    try:
        for _ in range(2):
            result = await ask(pipeline, req("and how do I fix it?", history=history))
            assert result.cache == "miss"
            assert result.cache_debug == {"lookup": "bypass"}
    finally:
        await llm.aclose()


async def test_an_abstention_is_not_stored(build: Build) -> None:
    pipeline = build()
    key = uuid.uuid4().hex
    text = scripted("Does Acme ship to the Moon?", key=key, answer="The documents do not say.")
    assert (await ask(pipeline, req(text))).cache == "miss"
    assert (await ask(pipeline, req(text))).cache == "miss"
    assert await calls_for(pipeline.settings.models.small.api_base or "", key) == 2


async def test_a_hit_does_not_extend_the_ttl(build: Build) -> None:
    pipeline = build(ttl_s=2)
    text = unique("What voids the Acme warranty?")
    await ask(pipeline, req(text))
    loop = asyncio.get_running_loop()
    stored_at = loop.time()
    for _ in range(3):  # hits at about 0.5 s, 1.0 s and 1.5 s
        await asyncio.sleep(0.5)
        assert (await ask(pipeline, req(text))).cache == "exact"
    await asyncio.sleep(max(0.0, stored_at + 2.3 - loop.time()))
    assert (await ask(pipeline, req(text))).cache == "miss"


async def test_the_per_tenant_cap_evicts_that_tenants_oldest_only(build: Build) -> None:
    pipeline = build(max_entries=2, threshold=0.999)
    theirs = unique("Acme warranty length?")
    await ask(pipeline, req(theirs, GLOBEX))
    asked = [unique(q) for q in ("Acme warranty?", "Acme shipping?", "Acme ERR-4471?")]
    for text in asked:
        await ask(pipeline, req(text))
    assert (await ask(pipeline, req(asked[2]))).cache == "exact"
    assert (await ask(pipeline, req(asked[1]))).cache == "exact"
    assert (await ask(pipeline, req(theirs, GLOBEX))).cache == "exact"  # not evicted by acme
    assert (await ask(pipeline, req(asked[0]))).cache == "miss"  # the oldest went


async def test_an_entry_that_does_not_decode_is_deleted_and_never_served(
    build: Build, store: tuple[CacheStore, RedisServer | None]
) -> None:
    pipeline = build(threshold=LOW)
    text = unique("Which damage does the Acme warranty exclude?")
    first = await ask(pipeline, req(text))
    assert first.cache == "miss"
    hit = await ask(pipeline, req(text))
    assert hit.cache == "exact"
    # Overwrite the stored answer with garbage under the same key and scope.
    probe = await pipeline.prepare(req(text, cache_lookup=False))
    found = probe.cache
    assert found.key is not None and found.scope is not None and probe.vector is not None
    garbage = CachedEntry(found.key, text, b'{"answer": 42', probe.vector)
    await store[0].put("acme", found.scope, garbage, ttl_s=60, max_entries=100)
    await pipeline.release(probe)
    again = await ask(pipeline, req(text))
    assert again.cache == "miss"  # nor a semantic hit on the same garbage
    assert await store[0].get("acme", found.key) is not None  # stored afresh by that miss
    assert (await ask(pipeline, req(text))).answer.text == first.answer.text


async def test_a_store_that_dies_is_served_around_and_counted(
    build: Build, store: tuple[CacheStore, RedisServer | None]
) -> None:
    server = store[1]
    if server is None:
        pytest.skip("the in-process store cannot go down")
    pipeline = build()
    text = unique("How do I fix ERR-4471 on the Acme router?")
    await ask(pipeline, req(text))
    server.kill()
    try:
        for _ in range(3):
            result = await ask(pipeline, req(text))
            assert result.cache == "miss" and result.answer.citations
            assert result.cache_debug == {"lookup": "error"}
        assert sample(pipeline, "querygate_cache_lookups_total", {"result": "error"}) == 3
    finally:
        server.restart()
    for _ in range(50):  # the pool reconnects by itself
        result = await ask(pipeline, req(text))
        if result.cache_debug != {"lookup": "error"}:
            break
        await asyncio.sleep(0.1)
    assert result.cache in ("miss", "exact")
    assert (await ask(pipeline, req(text))).cache == "exact"


async def test_a_prepared_lead_that_no_stream_handler_took_is_released(build: Build) -> None:
    pipeline = build()
    ctx = await pipeline.prepare(req(unique("What voids the Acme warranty?")))
    lease = ctx.cache.flight
    assert lease is not None  # it leads its key's single flight
    preparing: asyncio.Future[RequestContext] = asyncio.get_running_loop().create_future()
    release_abandoned(pipeline, preparing)  # the handler failed while preparation ran
    preparing.set_result(ctx)  # then preparation finished
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert ctx.cache.flight is None and lease.done
    flights = pipeline._cache.response.flights
    assert flights is not None and flights.leader_of(lease.tenant, lease.key) is None
