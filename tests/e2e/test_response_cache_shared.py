"""Two `querygate serve` processes sharing one real redis-server as their response cache: an
answer computed by one is served by the other (exact and semantic, JSON and streamed, both
APIs), tenants never share one, a document change retires a tenant's answers, concurrent
identical questions make one model call across both, and Redis killed mid-traffic fails no
request. Model calls are counted at the fake upstream by directive key."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, gateway_pair
from tests.redis_server import RedisServer

NO_CACHE = {"Cache-Control": "no-cache"}


@pytest.fixture(scope="module")
def pair(
    module_redis: RedisServer, fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    overrides = {
        "cache": {
            "backend": "redis",
            "redis_url": module_redis.url,
            "redis_socket_timeout_s": 0.1,
            "redis_connect_timeout_s": 0.2,
        },
        "quotas": {"backend": "memory"},
        "router": {"classifier": "heuristic"},
    }
    root = Path(tmp_path_factory.mktemp("cache-shared"))
    with gateway_pair(root, fake_upstream, overrides) as both:
        yield both


def ask(
    gw: GatewayProcess,
    text: str,
    tenant: str = "acme",
    headers: dict[str, str] | None = None,
    **body: Any,
) -> requests.Response:
    # globex may not force a route; "auto" routes these questions to lookup as well
    route = "lookup" if tenant == "acme" else "auto"
    return requests.post(
        f"{gw.url}/v1/query",
        json={"query": text, "route": route, **body},
        headers={**gw.headers(tenant), **(headers or {})},
        timeout=30,
    )


def answered(resp: requests.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def unique(text: str) -> str:
    return f"{text} (case {uuid.uuid4().hex[:8]})"


def scripted(text: str, **directive: Any) -> str:
    return f"{text} [[fake:{json.dumps(directive)}]]"


def events(resp: requests.Response) -> list[str]:
    assert resp.status_code == 200, resp.text
    return [block for block in resp.text.split("\n\n") if block.strip()]


def test_an_answer_computed_by_one_gateway_is_served_by_the_other(
    pair: tuple[GatewayProcess, GatewayProcess], fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    text = scripted(unique("How do I fix ERR-4471 on the Acme router?"), key=key)
    first = answered(ask(one, text))
    second = answered(ask(two, text))
    assert (first["cache"], second["cache"]) == ("miss", "exact")
    assert second["answer"] == first["answer"] and second["citations"] == first["citations"]
    assert second["usage"]["cost_usd"] == 0
    assert calls_for_sync(fake_upstream, key) == 1


def test_a_paraphrase_asked_of_the_other_gateway_is_a_semantic_hit(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    case = uuid.uuid4().hex[:8]
    first = answered(ask(one, f"How do I fix ERR-4471 on the router? (case {case})"))
    hit = answered(ask(two, f"How can I fix ERR-4471 on the router? (case {case})", debug=True))
    assert first["cache"] == "miss"
    assert hit["cache"] == "semantic"
    assert hit["answer"] == first["answer"] and hit["citations"] == first["citations"]
    assert hit["usage"]["cost_usd"] == 0
    assert hit["debug"]["cache"]["similarity"] >= 0.95
    assert two.metrics().value("querygate_cache_lookups_total", result="semantic") >= 1
    assert two.metrics().value("querygate_cache_nearest_similarity_count") >= 1
    lines = [json.loads(raw) for raw in two.log().splitlines() if raw.startswith("{")]
    line = next(x for x in lines if x.get("msg") == "request" and x.get("request_id") == hit["id"])
    assert line["cache"] == "semantic" and line["cache_nearest_similarity"] >= 0.95


def test_a_near_question_that_differs_in_a_number_is_refused_across_gateways(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    case = uuid.uuid4().hex[:8]
    answered(ask(one, f"Acme warranty terms in 2024? (case {case})"))
    other = answered(ask(two, f"Acme warranty terms in 2025? (case {case})", debug=True))
    assert other["cache"] == "miss"
    assert "numbers" in other["debug"]["cache"]["refused_by"]


def test_tenant_b_never_gets_tenant_as_answer_for_the_identical_question(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    text = unique("What does the warranty cover?")
    answered(ask(one, text, "acme"))
    assert answered(ask(two, text, "acme"))["cache"] == "exact"  # it is cached
    for gw in (one, two):
        theirs = answered(ask(gw, text, "globex"))
        assert theirs["cache"] == "miss"
        assert not {c["doc_id"] for c in theirs["citations"]} & {"errors.md", "warranty.txt"}


def test_a_document_change_retires_the_tenants_cached_answers(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    text = unique("How long do Acme replacement units take to ship?")
    answered(ask(one, text))
    assert answered(ask(two, text))["cache"] == "exact"
    # Each gateway here has its own embedded index, so the change goes to both (with
    # OpenSearch the fleet shares one index and one generation).
    doc = f"shipping-{uuid.uuid4().hex[:6]}"
    for gw in pair:
        put = requests.put(
            f"{gw.url}/v1/documents/{doc}",
            json={"title": "Shipping", "text": "Acme replacement units now ship within two days."},
            headers=gw.headers(),
            timeout=30,
        )
        assert put.status_code in (200, 201), put.text
    assert answered(ask(one, text))["cache"] == "miss"
    assert answered(ask(two, text))["cache"] == "exact"  # the answer computed after the change


def test_concurrent_identical_questions_on_both_gateways_make_one_model_call(
    pair: tuple[GatewayProcess, GatewayProcess], fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    text = scripted(unique("Why does ERR-5120 appear on Acme routers?"), key=key, delay_ms=1500)
    with ThreadPoolExecutor(max_workers=6) as pool:
        resps = list(pool.map(lambda gw: ask(gw, text), [one, two] * 3))
    bodies = [answered(r) for r in resps]
    assert calls_for_sync(fake_upstream, key) == 1
    assert sorted(b["cache"] for b in bodies) == ["exact"] * 5 + ["miss"]
    assert len({b["answer"] for b in bodies}) == 1


def test_no_cache_answers_afresh_over_http(
    pair: tuple[GatewayProcess, GatewayProcess], fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    text = scripted(unique("How do I restore a signed Acme backup?"), key=key)
    answered(ask(one, text))
    assert answered(ask(two, text, headers=NO_CACHE))["cache"] == "miss"
    assert calls_for_sync(fake_upstream, key) == 2
    assert answered(ask(two, text))["cache"] == "exact"


def test_a_streamed_answer_is_stored_and_replayed_as_a_stream_by_the_other_gateway(
    pair: tuple[GatewayProcess, GatewayProcess], fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    answer = "Renew the upstream certificate, then run acme-cli reload {cite:1}. It clears."
    text = scripted(unique("How is ERR-4471 cleared on Acme routers?"), key=key, answer=answer)
    first = events(ask(one, text, stream=True))
    done = json.loads(next(e for e in first if e.startswith("event: done")).split("data: ")[1])
    assert done["cache"] == "miss"
    replay = events(ask(two, text, stream=True))
    deltas = [e for e in replay if e.startswith("event: delta")]
    body = json.loads(next(e for e in replay if e.startswith("event: done")).split("data: ")[1])
    assert body["cache"] == "exact"
    assert len(deltas) > 1
    streamed = "".join(json.loads(d.split("data: ", 1)[1])["text"] for d in deltas)
    assert streamed == body["answer"] == done["answer"]
    assert calls_for_sync(fake_upstream, key) == 1


def test_the_openai_endpoint_says_which_tier_answered_streamed_or_not(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    text = unique("What does the Acme warranty exclude?")
    chat = {"model": "lookup", "messages": [{"role": "user", "content": text}]}
    url = "/v1/chat/completions"
    first = requests.post(f"{one.url}{url}", json=chat, headers=one.headers(), timeout=30)
    assert first.status_code == 200, first.text
    assert first.json()["querygate"]["cache"] == "miss"
    again = requests.post(f"{two.url}{url}", json=chat, headers=two.headers(), timeout=30)
    assert again.status_code == 200, again.text
    assert again.json()["querygate"]["cache"] == "exact"
    streamed = requests.post(
        f"{two.url}{url}", json={**chat, "stream": True}, headers=two.headers(), timeout=30
    )
    chunks = [e.removeprefix("data: ") for e in events(streamed)]
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed if c["choices"])
    assert content == again.json()["choices"][0]["message"]["content"]
    final = next(c for c in parsed if c.get("querygate"))
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["querygate"]["cache"] == "exact"


def test_a_system_message_or_an_earlier_turn_is_part_of_what_is_cached(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    text = unique("What does the Acme warranty cover?")
    url = "/v1/chat/completions"

    def chat(gw: GatewayProcess, *before: dict[str, str]) -> str:
        body = {"model": "lookup", "messages": [*before, {"role": "user", "content": text}]}
        resp = requests.post(f"{gw.url}{url}", json=body, headers=gw.headers(), timeout=30)
        assert resp.status_code == 200, resp.text
        cache: str = resp.json()["querygate"]["cache"]
        return cache

    french = {"role": "system", "content": "Answer only in French."}
    turn = {"role": "user", "content": "I bought an Acme router in 2021."}
    reply = {"role": "assistant", "content": "Noted."}
    assert chat(one) == "miss"
    assert chat(two, french) == "miss"  # not the answer written without it
    assert chat(one, turn, reply) == "miss"
    assert chat(two, french) == "exact"  # the same conversation is cached
    assert chat(one, turn, reply) == "exact"


def test_redis_killed_mid_traffic_fails_no_request_and_the_cache_comes_back(
    pair: tuple[GatewayProcess, GatewayProcess], module_redis: RedisServer
) -> None:
    one, two = pair
    text = unique("How do I fix ERR-4471 on the Acme router?")
    answered(ask(one, text))
    errors_before = sum(
        g.metrics().value("querygate_cache_lookups_total", result="error") for g in pair
    )
    statuses: list[int] = []
    caches: list[str] = []

    def traffic(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for gw in pair:
                resp = ask(gw, text)
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    caches.append(resp.json()["cache"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        running = [pool.submit(traffic, 4.0) for _ in range(2)]
        time.sleep(1.0)
        module_redis.kill()
        time.sleep(2.0)
        module_redis.restart()
        for f in running:
            f.result()
    assert statuses and set(statuses) == {200}
    assert "exact" in caches and "miss" in caches  # before, during
    errors = sum(g.metrics().value("querygate_cache_lookups_total", result="error") for g in pair)
    assert errors > errors_before
    # Back by itself: a new answer is stored and served again.
    again = unique("How do I fix ERR-5120 on the Acme router?")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        answered(ask(one, again))
        if answered(ask(two, again))["cache"] == "exact":
            break
        time.sleep(0.2)
    else:
        pytest.fail("the cache did not come back after Redis restarted")


def calls_for_sync(upstream: str, key: str) -> int:
    """How many model calls carrying directive `key` reached the fake upstream."""
    resp = requests.get(f"{upstream.removesuffix('/v1')}/admin/stats", timeout=5)
    resp.raise_for_status()
    return int(resp.json()["by_key"].get(key, 0))
