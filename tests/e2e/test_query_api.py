"""`querygate serve` as a process, answering through the fake upstream (litellm's real path)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.upstream import calls_for


def query(
    gw: GatewayProcess, text: str, tenant: str = "acme", fresh: bool = False, **body: object
) -> requests.Response:
    """`fresh`: `Cache-Control: no-cache`, so no earlier test's cached answer can answer."""
    headers = {**gw.headers(tenant), **NO_CACHE} if fresh else gw.headers(tenant)
    return requests.post(
        f"{gw.url}/v1/query", json={"query": text, **body}, headers=headers, timeout=30
    )


NO_CACHE = {"Cache-Control": "no-cache"}


def test_lookup_answers_with_citations_cost_and_timings(gateway: GatewayProcess) -> None:
    resp = query(gateway, "How do I fix ERR-4471 on the Acme router?", fresh=True)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["route"] == "lookup"
    assert body["cache"] == "miss"
    assert body["answer"].startswith("FAKE ANSWER")
    assert body["citations"], body
    assert body["citations"][0]["doc_id"] == "errors.md"
    assert body["usage"]["prompt_tokens"] > 0
    assert body["usage"]["cost_usd"] > 0
    assert {"embed", "retrieve", "generate", "total"} <= set(body["timings_ms"])
    assert resp.headers["X-Request-Id"] == body["id"]


def test_repeated_question_is_an_exact_cache_hit_that_costs_nothing(
    gateway: GatewayProcess,
) -> None:
    text = "What does the Acme warranty cover?"
    first = query(gateway, text, fresh=True).json()
    second = query(gateway, "  " + text.upper() + " ").json()
    assert first["cache"] == "miss"
    assert second["cache"] == "exact"
    assert second["answer"] == first["answer"]
    assert second["citations"] == first["citations"]
    assert second["usage"]["cost_usd"] == 0


def test_cached_answers_never_cross_tenants(gateway: GatewayProcess) -> None:
    text = "What does the warranty cover?"
    assert query(gateway, text, tenant="acme", fresh=True).json()["cache"] == "miss"
    other = query(gateway, text, tenant="globex").json()
    assert other["cache"] == "miss"
    assert other["citations"], other  # else the isolation check below would pass vacuously
    assert not {c["doc_id"] for c in other["citations"]} & {"errors.md", "warranty.txt"}


def test_a_tenant_never_sees_another_tenants_documents(gateway: GatewayProcess) -> None:
    # The globex document is the perfect match; acme must still get only its own.
    text = "What is the Hammerfall launch code HF-99812?"
    body = query(gateway, text, route="lookup", fresh=True).json()
    assert body["citations"], body  # else the isolation check below would pass vacuously
    globex_docs = {"globex-launch", "globex-warranty"}
    assert not {c["doc_id"] for c in body["citations"]} & globex_docs, body
    assert "HF-99812" not in json.dumps(body["citations"])


def test_greeting_goes_direct_without_retrieval(gateway: GatewayProcess) -> None:
    body = query(gateway, "hello!").json()
    assert body["route"] == "direct"
    assert body["citations"] == []
    assert "retrieve" not in body["timings_ms"]


def test_a_search_phrasing_reaches_the_document_just_put(gateway: GatewayProcess) -> None:
    # The classifier takes phrasings like this one for chat; only small talk is answered
    # without the documents.
    doc_id = f"zorblax-{uuid.uuid4().hex[:6]}"
    text = "To reset the Zorblax 9000, hold its power button for ten seconds until it blinks."
    put = requests.put(
        f"{gateway.url}/v1/documents/{doc_id}",
        json={"title": "Zorblax 9000 manual", "text": text},
        headers=gateway.headers("globex"),
        timeout=30,
    )
    assert put.status_code == 201, put.text
    body = query(gateway, "How do I reset the Zorblax 9000?", tenant="globex", fresh=True).json()
    assert body["route"] == "lookup", body["route_reason"]
    assert doc_id in {c["doc_id"] for c in body["citations"]}, body


def test_multihop_question_runs_the_agent_loop_on_the_large_tier(gateway: GatewayProcess) -> None:
    text = "What is the total population of the capitals of the five largest EU countries?"
    resp = query(gateway, text, fresh=True, debug=True)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["route"] == "multihop"
    assert "agent" in body["timings_ms"]
    assert set(body["usage"]["by_tier"]) == {"large"}
    assert len(body["debug"]["agent"]["steps"]) == 1  # the fake answers at once, no tools


def test_without_a_large_model_multihop_is_answered_by_lookup_and_says_so(
    extractive: GatewayProcess,
) -> None:
    text = "What is the total population of the capitals of the five largest EU countries?"
    body = query(extractive, text, fresh=True).json()
    assert body["route"] == "lookup"
    assert "multihop route is not available" in body["route_reason"]


def test_route_endpoint_explains_without_answering(gateway: GatewayProcess) -> None:
    resp = requests.post(
        f"{gateway.url}/v1/route",
        json={"query": "what does ERR-4471 mean?"},
        headers=gateway.headers(),
        timeout=10,
    )
    body = resp.json()
    assert body["route"] == "lookup"
    assert body["lexical_weight"] > 1.0
    assert "ERR-4471" in body["route_reason"]
    assert "answer" not in body


def test_streamed_query_sends_deltas_then_the_full_body(gateway: GatewayProcess) -> None:
    resp = requests.post(
        f"{gateway.url}/v1/query",
        json={
            "query": "How long does Acme take to ship a replacement?",
            "stream": True,
        },
        headers={**gateway.headers(), **NO_CACHE},
        stream=True,
        timeout=30,
    )
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = [block for block in resp.text.split("\n\n") if block.strip()]
    deltas = [e for e in events if e.startswith("event: delta")]
    done = [e for e in events if e.startswith("event: done")]
    assert deltas and len(done) == 1
    body = json.loads(done[0].split("data: ", 1)[1])
    text = "".join(json.loads(d.split("data: ", 1)[1])["text"] for d in deltas)
    assert body["answer"] == text.strip()
    assert body["usage"]["cost_usd"] > 0


def test_upstream_down_is_a_503_with_retry_after(gateway: GatewayProcess) -> None:
    # Forced direct: straight to the model, so the scripted failure is what the gateway meets.
    resp = query(gateway, 'Hello [[fake:{"status": 500}]]', route="direct", fresh=True)
    assert resp.status_code == 503
    assert int(resp.headers["Retry-After"]) > 0
    assert resp.json()["error"]["type"] == "unavailable"


def test_metrics_expose_the_documented_families(gateway: GatewayProcess) -> None:
    query(gateway, "Acme warranty length?", fresh=True)
    text = requests.get(f"{gateway.url}/metrics", timeout=5).text
    for family in (
        "querygate_requests_total",
        "querygate_request_duration_seconds_bucket",
        "querygate_stage_duration_seconds_bucket",
        "querygate_route_decisions_total",
        "querygate_cache_lookups_total",
        "querygate_llm_requests_total",
        "querygate_llm_tokens_total",
        "querygate_llm_cost_usd_total",
        "querygate_retrieval_duration_seconds_bucket",
        "querygate_inflight_requests",
        "querygate_config_info",
    ):
        assert family in text, family
    assert "acme" not in text  # no tenant ids in labels


def test_health_and_readiness(gateway: GatewayProcess) -> None:
    assert requests.get(f"{gateway.url}/healthz", timeout=5).json() == {"status": "ok"}
    ready = requests.get(f"{gateway.url}/readyz", timeout=5).json()
    assert ready["ready"] is True
    assert ready["checks"]["retrieval"] == "ok"


def test_without_a_model_lookup_is_extractive_and_cited(extractive: GatewayProcess) -> None:
    body = query(extractive, "How do I fix ERR-4471?", fresh=True).json()
    assert body["extractive"] is True
    assert body["citations"][0]["doc_id"] == "errors.md"
    assert "certificate" in body["answer"]
    assert body["usage"]["cost_usd"] == 0


def test_debug_adds_the_full_decision_only_when_asked(gateway: GatewayProcess) -> None:
    plain = query(gateway, "What does the Acme warranty exclude?", fresh=True).json()
    assert "debug" not in plain
    body = query(gateway, "What does the Acme warranty exclude?", fresh=True, debug=True).json()
    decision = body["debug"]["decision"]
    assert decision["route"] == body["route"]
    assert set(decision["classifier"]["scores"]) == {"direct", "lookup", "multihop"}


THIN = "Who was the Acme designer's Nobel laureate neighbour?"


def test_thin_evidence_escalates_to_the_agent_visibly_and_is_counted(
    gateway: GatewayProcess,
) -> None:
    before = escalations(gateway, "lookup", "multihop")
    resp = query(gateway, THIN, fresh=True, debug=True)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["debug"]["decision"]["route"] == "lookup"  # the policy chose lookup...
    assert body["route"] == "multihop"  # ...whose thin evidence the agent then answered
    assert body["escalated"] is True
    assert "escalated: evidence" in body["route_reason"]
    assert body["debug"]["agent"]["steps"]
    assert escalations(gateway, "lookup", "multihop") == before + 1


def test_thin_evidence_without_an_agent_says_so_with_the_best_passages(
    extractive: GatewayProcess,
) -> None:
    before = escalations(extractive, "lookup", "none")
    body = query(extractive, THIN, fresh=True).json()
    assert body["escalated"] is True
    assert body["answer"].startswith("Not enough evidence")
    assert body["citations"]  # the best it found, for the reader to judge
    assert escalations(extractive, "lookup", "none") == before + 1


def test_a_forced_lookup_is_answered_as_asked_never_escalated(gateway: GatewayProcess) -> None:
    body = query(gateway, THIN, route="lookup", fresh=True).json()
    assert body["route"] == "lookup"
    assert body["escalated"] is False


def escalations(gw: GatewayProcess, from_route: str, to_route: str) -> float:
    """The summed escalation count between two routes, over every reason."""
    scrape = gw.metrics()
    return scrape.value("querygate_escalations_total", from_route=from_route, to_route=to_route)


def test_a_client_that_hangs_up_stops_the_agent_and_its_model_calls(
    gateway: GatewayProcess, fake_upstream: str
) -> None:
    key = uuid.uuid4().hex
    search = {"name": "search", "arguments": {"query": "Acme warranty"}}
    directive = {"key": key, "delay_ms": 700, "turns": [{"tool_calls": [search]}]}
    body = {"query": f"Acme warranty? [[fake:{json.dumps(directive)}]]", "route": "multihop"}
    with pytest.raises(requests.Timeout):
        requests.post(f"{gateway.url}/v1/query", json=body, headers=gateway.headers(), timeout=1)
    time.sleep(3)  # four more slow turns would have run by now
    assert asyncio.run(calls_for(fake_upstream, key)) <= 2
