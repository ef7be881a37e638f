"""The rerank stage through /v1/query, the app in process with an in-memory reranker: what
`debug`, `timings_ms`, the usage and the metrics say, that a failed rerank keeps the fused order,
and that a tenant's reranks and their cost are its own."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from gateway.settings import hash_api_key
from tests.fakes.llm import FakeLLM
from tests.fakes.rerank import FakeReranker
from tests.fixtures.app import Client, OpenClient, auth, scrape
from tests.fixtures.gateway import KEYS

pytestmark = pytest.mark.asyncio(loop_scope="session")

REMOTE = {"model": "cohere/fake-rerank", "api_base": "http://127.0.0.1:9/v1/rerank"}
NO_CACHE = {"backend": "off"}
QUESTION = "How do I clear ERR-4471 after the certificate expired?"


def rerank(**policy: Any) -> dict[str, Any]:
    return {"rerank": {"reranker": "remote", "remote": REMOTE, **policy}}


async def ask(client: Client, query: str = QUESTION, tenant: str = "acme") -> dict[str, Any]:
    body = {"query": query, "debug": True}
    async with client.post("/v1/query", json=body, headers=auth(tenant)) as resp:
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
        return answer


def cited(answer: dict[str, Any]) -> list[str]:
    return [c["chunk_id"] for c in answer["citations"]]


async def test_with_the_reranker_off_each_lookup_says_skipped_off_and_times_nothing(
    app_client: OpenClient,
) -> None:
    client = await app_client(cache=NO_CACHE)  # the suite's configuration turns it off
    answer = await ask(client)
    assert answer["route"] == "lookup"
    (trace,) = answer["debug"]["rerank"]
    assert (trace["decision"], trace["reranker"], trace["site"]) == ("skipped_off", "off", "lookup")
    assert "rerank" not in answer["timings_ms"]
    metrics = await scrape(client)
    assert metrics.value("querygate_rerank_total", decision="skipped_off") == 1
    assert metrics.value("querygate_rerank_duration_seconds_count") == 0


async def test_a_reranked_lookup_shows_in_debug_timings_and_metrics(
    app_client: OpenClient,
) -> None:
    fake = FakeReranker(score=lambda q, p: 1.0 if "warranty" in p else 0.0)
    client = await app_client(
        reranker=fake, cache=NO_CACHE, retrieval=rerank(when="always", candidates=5, blend=0)
    )
    answer = await ask(client, "Which error codes does the router have?")
    (trace,) = answer["debug"]["rerank"]
    assert trace["decision"] == "reranked"
    assert (trace["reranker"], trace["model"]) == ("remote", "fake-rerank")
    assert trace["candidates"] == len(fake.requests[0].passages) <= 5
    assert "rerank" in answer["timings_ms"]
    # the reranker's favourite is cited first, whatever fusion made of it
    assert answer["citations"][0]["doc_id"] == "warranty.txt"
    assert fake.requests[0].tenant == "acme"
    metrics = await scrape(client)
    assert metrics.value("querygate_rerank_total", decision="reranked") == 1
    assert metrics.value("querygate_rerank_duration_seconds_count", reranker="remote") == 1
    assert metrics.value("querygate_stage_duration_seconds_count", stage="rerank") == 1


async def test_a_clear_leader_is_not_reranked(app_client: OpenClient) -> None:
    fake = FakeReranker()
    # A margin of 0 leaves only exact ties to rerank; the identifier's passage leads. A model
    # writes the answer: no extractive answer orders its sentences with the reranker.
    client = await app_client(
        llm=FakeLLM(), reranker=fake, cache=NO_CACHE, retrieval=rerank(max_margin=0.0)
    )
    answer = await ask(client)
    (trace,) = answer["debug"]["rerank"]
    assert trace["decision"] == "skipped_confident"
    assert trace["candidates"] == 0 and fake.requests == []
    assert "rerank" in answer["timings_ms"]  # the stage ran, if only to decide


async def test_a_failing_reranker_keeps_the_fused_order_and_the_answer_says_so(
    app_client: OpenClient,
) -> None:
    fused = await ask(await app_client(cache=NO_CACHE))
    client = await app_client(
        reranker=FakeReranker(fail=True), retrieval=rerank(when="always")
    )  # the cache on: a degraded answer must not be stored
    first = await ask(client)
    (search,) = first["debug"]["rerank"]
    assert (search["site"], search["decision"]) == ("lookup", "failed")
    assert "fake reranker is down" in search["detail"]
    # The fused order stands; the extractive answer cites it in the search's order, led by
    # its first passage, as after any rerank stage.
    assert cited(first)[0] == cited(fused)[0]
    assert "rerank failed (lookup" in first["route_reason"]
    assert "the fused order was kept" in first["route_reason"]
    again = await ask(client)
    assert again["cache"] == "miss"
    assert (await scrape(client)).value("querygate_rerank_total", decision="failed") == 2


@pytest.fixture(scope="module")
async def priced(app_client: OpenClient) -> tuple[Client, FakeReranker]:
    """Reranks at $0.10 a call; acme has a day's budget of $0.15, globex none."""
    fake = FakeReranker(price_usd=0.1)
    tenants = [
        {"id": "acme", "api_key_sha256": hash_api_key(KEYS["acme"]), "daily_budget_usd": 0.15},
        {"id": "globex", "api_key_sha256": hash_api_key(KEYS["globex"])},
    ]
    # A model writes the answers (no extractive sentence ordering), and no lookup escalates:
    # one rerank per question.
    client = await app_client(
        llm=FakeLLM(),
        reranker=fake,
        cache=NO_CACHE,
        tenants=tenants,
        retrieval=rerank(when="always"),
        router={"escalation": {"enabled": False}},
    )
    return client, fake


async def test_a_tenants_rerank_cost_is_its_own(priced: tuple[Client, FakeReranker]) -> None:
    client, fake = priced
    globex = await ask(client, "What does ERR-4471 mean at Globex?", tenant="globex")
    acme = await ask(client, f"How do I clear ERR-4471? {uuid.uuid4().hex[:6]}")
    for answer in (globex, acme):
        assert answer["usage"]["by_tier"]["rerank"]["cost_usd"] == pytest.approx(0.1)
        model_cost = answer["usage"]["by_tier"]["small"]["cost_usd"]
        assert answer["usage"]["cost_usd"] == pytest.approx(0.1 + model_cost)
        assert len(answer["debug"]["rerank"]) == 1  # its own search only
    assert [r.tenant for r in fake.requests] == ["globex", "acme"]
    # Each tenant's passages came from its own documents.
    assert all("globex" in c for c in cited(globex))
    assert not any("globex" in c for c in cited(acme))
    # acme's second paid rerank spends its budget ($0.20 > $0.15): the model call after it is
    # refused, while globex, who paid as much, goes on.
    query = {"query": f"How do I clear ERR-5120? {uuid.uuid4().hex[:6]}"}
    async with client.post("/v1/query", json=query, headers=auth("acme")) as resp:
        assert resp.status == 429
        assert (await resp.json())["error"]["type"] == "budget_exceeded"
    await ask(client, "What is the Globex warranty?", tenant="globex")
    metrics = await scrape(client)
    spent = metrics.value("querygate_rerank_cost_usd_total", model="fake-rerank")
    assert spent == pytest.approx(0.4)
