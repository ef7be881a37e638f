"""The remote reranker through litellm's real `arerank` against the fake upstream process
(its `/v1/rerank`, Cohere's shape): scores in the passages' order, retries, breakers, the
deadline, the price; then the gateway over it, keeping the fused order when it is down."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from backends.errors import BackendUnavailable, UpstreamError
from backends.rerank.base import RerankRequest
from backends.rerank.config import RemoteRerankConfig
from backends.rerank.remote import RemoteReranker
from tests.fake_upstream.server import overlap_score
from tests.fixtures.app import OpenClient, auth
from tests.fixtures.upstream import calls_for, upstream_stats

pytestmark = pytest.mark.asyncio(loop_scope="session")

MODEL = "fake-rerank"
DOWN = "http://127.0.0.1:9/v1/rerank"  # the discard port: nothing answers
PASSAGES = ("Berlin is in Germany", "Paris is the capital of France", "France and Spain")


def endpoint(fake_upstream: str) -> str:
    return f"{fake_upstream}/rerank"  # the fake's base URL ends in /v1


def reranker(api_base: str, **config: Any) -> RemoteReranker:
    settings = RemoteRerankConfig(model=f"cohere/{MODEL}", api_base=api_base, **config)
    return RemoteReranker(settings, backoff_initial_s=0.01, backoff_max_s=0.02)


def scripted(query: str, **directive: Any) -> tuple[str, str]:
    key = uuid.uuid4().hex
    return f"{query} [[fake:{json.dumps({'key': key, **directive})}]]", key


async def test_scores_come_back_in_the_passages_order(fake_upstream: str) -> None:
    costs: list[float] = []
    remote = reranker(endpoint(fake_upstream), cost_per_search_unit_usd=0.002)
    query = "capital of France"
    scores = await remote.scores(RerankRequest("acme", query, PASSAGES, on_cost=costs.append))
    assert scores == [overlap_score(query, p) for p in PASSAGES]
    assert scores.index(max(scores)) == 1
    assert costs == [pytest.approx(0.002)]  # one search unit


async def test_the_price_follows_the_billed_units(fake_upstream: str) -> None:
    costs: list[float] = []
    remote = reranker(
        endpoint(fake_upstream), cost_per_search_unit_usd=0.002, cost_per_token_usd=1e-6
    )
    query, _ = scripted("capital", billed_units={"search_units": 3, "total_tokens": 500})
    await remote.scores(RerankRequest("acme", query, PASSAGES, on_cost=costs.append))
    assert costs == [pytest.approx(3 * 0.002 + 500 * 1e-6)]


async def test_a_5xx_is_retried_and_then_answers(fake_upstream: str) -> None:
    query, key = scripted("capital of France", fail_first=1, status=503)
    remote = reranker(endpoint(fake_upstream), retries=1)
    scores = await remote.scores(RerankRequest("acme", query, PASSAGES))
    assert len(scores) == 3
    assert await calls_for(fake_upstream, key) == 2


async def test_a_refusal_is_not_retried(fake_upstream: str) -> None:
    query, key = scripted("q", status=400)
    with pytest.raises(UpstreamError):
        await reranker(endpoint(fake_upstream), retries=2).scores(
            RerankRequest("acme", query, PASSAGES)
        )
    assert await calls_for(fake_upstream, key) == 1


async def test_a_malformed_answer_is_an_upstream_error(fake_upstream: str) -> None:
    query, _ = scripted("q", raw={"results": [{"index": 7, "relevance_score": 1.0}]})
    with pytest.raises(UpstreamError, match="wrong index"):
        await reranker(endpoint(fake_upstream)).scores(RerankRequest("acme", query, PASSAGES[:1]))


async def test_a_down_upstream_is_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="rerank unavailable"):
        await reranker(DOWN, retries=0).scores(RerankRequest("acme", "q", PASSAGES))


async def test_the_deadline_ends_the_call_and_its_retries(fake_upstream: str) -> None:
    query, key = scripted("q", delay_ms=3000)
    request = RerankRequest("acme", query, PASSAGES, deadline=time.monotonic() + 0.3)
    with pytest.raises(BackendUnavailable, match="no answer by the deadline"):
        await reranker(endpoint(fake_upstream), retries=3, timeout_s=30).scores(request)
    assert await calls_for(fake_upstream, key) == 1  # no retry once the deadline had passed


async def test_a_tenants_failures_cool_the_reranker_down_for_it_alone(fake_upstream: str) -> None:
    remote = reranker(endpoint(fake_upstream), retries=0, cooldown_after=2, cooldown_s=60)
    good, _ = scripted("capital of France")
    await remote.scores(RerankRequest("globex", good, PASSAGES))  # a second tenant is known
    failing, key = scripted("q", status=503)
    for _ in range(2):
        with pytest.raises(BackendUnavailable):
            await remote.scores(RerankRequest("acme", failing, PASSAGES))
    with pytest.raises(BackendUnavailable, match="cooling down"):
        await remote.scores(RerankRequest("acme", failing, PASSAGES))
    assert await calls_for(fake_upstream, key) == 2  # the third never left the process
    assert len(await remote.scores(RerankRequest("globex", good, PASSAGES))) == 3


def rerank_config(api_base: str, **policy: Any) -> dict[str, Any]:
    remote = {"model": f"cohere/{MODEL}", "api_base": api_base, "cost_per_search_unit_usd": 0.01}
    return {"rerank": {"reranker": "remote", "remote": remote, "when": "always", **policy}}


async def reranks_served(fake_upstream: str) -> int:
    return int((await upstream_stats(fake_upstream))["by_model"].get(MODEL, 0))


async def ask(client: Any, query: str, tenant: str = "acme") -> dict[str, Any]:
    body = {"query": query, "debug": True}
    async with client.post("/v1/query", json=body, headers=auth(tenant)) as resp:
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
        return answer


async def test_the_gateway_reranks_through_the_upstream_and_bills_the_asking_tenant(
    app_client: OpenClient, fake_upstream: str
) -> None:
    client = await app_client(
        upstream=fake_upstream,
        cache={"backend": "off"},
        retrieval=rerank_config(endpoint(fake_upstream)),
    )
    before = await reranks_served(fake_upstream)
    answer = await ask(client, "How do I clear ERR-4471?")
    (trace,) = answer["debug"]["rerank"]
    assert trace["decision"] == "reranked"
    assert trace["model"] == f"cohere/{MODEL}"
    assert await reranks_served(fake_upstream) == before + 1
    assert answer["usage"]["by_tier"]["rerank"]["cost_usd"] == pytest.approx(0.01)
    other = await ask(client, "What does ERR-4471 mean at Globex?", tenant="globex")
    assert other["usage"]["by_tier"]["rerank"]["cost_usd"] == pytest.approx(0.01)
    assert other["debug"]["rerank"][0]["decision"] == "reranked"


async def test_with_the_upstream_down_the_gateway_keeps_the_fused_order(
    app_client: OpenClient, fake_upstream: str
) -> None:
    fused = await app_client(upstream=fake_upstream, cache={"backend": "off"})
    down = await app_client(
        upstream=fake_upstream,
        cache={"backend": "off"},
        retrieval=rerank_config(DOWN),
    )
    query = "How do I clear ERR-4471?"
    expected = await ask(fused, query)
    answer = await ask(down, query)
    (trace,) = answer["debug"]["rerank"]
    assert trace["decision"] == "failed"
    assert "rerank unavailable" in trace["detail"]
    assert "the fused order was kept" in answer["route_reason"]
    assert [c["chunk_id"] for c in answer["citations"]] == [
        c["chunk_id"] for c in expected["citations"]
    ]
    assert "rerank" not in answer["usage"]["by_tier"]  # nothing answered, nothing billed


async def test_the_warm_up_calls_nobody(fake_upstream: str) -> None:
    before = await reranks_served(fake_upstream)
    remote = reranker(endpoint(fake_upstream))
    await remote.warm_up()
    assert await reranks_served(fake_upstream) == before
    query = "capital of France"
    assert len(await remote.scores(RerankRequest("acme", query, PASSAGES))) == 3
