"""Two replicas sharing one real redis-server as their response cache: an answer computed by
one is served by the other (exact and semantic, JSON and streamed, both APIs), tenants never
share one, a document change retires a tenant's answers, concurrent identical questions make
one model call across both, and Redis killed mid-traffic fails no request. Model calls are
counted at the fake upstream by directive key.

The replicas are two apps in this process (`app_client`), each with its own cache store, Redis
connection, single flight and index, over litellm's real client to the fake upstream: what
they share is only the redis-server, as two `querygate serve` processes do.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from tests.fixtures.app import Client, LogLines, OpenClient, auth, scrape
from tests.fixtures.upstream import calls_for
from tests.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

Pair = tuple[Client, Client]
NO_CACHE = {"Cache-Control": "no-cache"}


@pytest.fixture(scope="module")
async def pair(app_client: OpenClient, module_redis: RedisServer, fake_upstream: str) -> Pair:
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
    one = await app_client(upstream=fake_upstream, **overrides)
    two = await app_client(upstream=fake_upstream, **overrides)
    return one, two


class Reply:
    """One response, read whole."""

    def __init__(self, status: int, text: str) -> None:
        self.status, self.text = status, text

    def json(self) -> Any:
        return json.loads(self.text)


async def post(
    client: Client, path: str, body: dict[str, Any], tenant: str, headers: dict[str, str]
) -> Reply:
    async with client.post(path, json=body, headers={**auth(tenant), **headers}) as resp:
        return Reply(resp.status, await resp.text())


async def ask(
    client: Client,
    text: str,
    tenant: str = "acme",
    headers: dict[str, str] | None = None,
    **body: Any,
) -> Reply:
    # globex may not force a route; "auto" routes these questions to lookup as well
    route = "lookup" if tenant == "acme" else "auto"
    query = {"query": text, "route": route, **body}
    return await post(client, "/v1/query", query, tenant, headers or {})


def answered(resp: Reply) -> dict[str, Any]:
    assert resp.status == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def unique(text: str) -> str:
    return f"{text} (case {uuid.uuid4().hex[:8]})"


def scripted(text: str, **directive: Any) -> str:
    return f"{text} [[fake:{json.dumps(directive)}]]"


def events(resp: Reply) -> list[str]:
    assert resp.status == 200, resp.text
    return [block for block in resp.text.split("\n\n") if block.strip()]


async def test_an_answer_computed_by_one_gateway_is_served_by_the_other(
    pair: Pair, fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    text = scripted(unique("How do I fix ERR-4471 on the Acme router?"), key=key)
    first = answered(await ask(one, text))
    second = answered(await ask(two, text))
    assert (first["cache"], second["cache"]) == ("miss", "exact")
    assert second["answer"] == first["answer"] and second["citations"] == first["citations"]
    assert second["usage"]["cost_usd"] == 0
    assert await calls_for(fake_upstream, key) == 1


async def test_a_paraphrase_asked_of_the_other_gateway_is_a_semantic_hit(
    pair: Pair, gateway_log: LogLines
) -> None:
    one, two = pair
    case = uuid.uuid4().hex[:8]
    first = answered(await ask(one, f"How do I fix ERR-4471 on the router? (case {case})"))
    hit = answered(
        await ask(two, f"How can I fix ERR-4471 on the router? (case {case})", debug=True)
    )
    assert first["cache"] == "miss"
    assert hit["cache"] == "semantic"
    assert hit["answer"] == first["answer"] and hit["citations"] == first["citations"]
    assert hit["usage"]["cost_usd"] == 0
    assert hit["debug"]["cache"]["similarity"] >= 0.95
    metrics = await scrape(two)
    assert metrics.value("querygate_cache_lookups_total", result="semantic") >= 1
    assert metrics.value("querygate_cache_nearest_similarity_count") >= 1
    lines = await gateway_log.request_lines(hit["id"])
    line = next(x for x in lines if x["msg"] == "request")
    assert line["cache"] == "semantic" and line["cache_nearest_similarity"] >= 0.95


async def test_a_near_question_that_differs_in_a_number_is_refused_across_gateways(
    pair: Pair,
) -> None:
    one, two = pair
    case = uuid.uuid4().hex[:8]
    answered(await ask(one, f"Acme warranty terms in 2024? (case {case})"))
    other = answered(await ask(two, f"Acme warranty terms in 2025? (case {case})", debug=True))
    assert other["cache"] == "miss"
    assert "numbers" in other["debug"]["cache"]["refused_by"]


async def test_tenant_b_never_gets_tenant_as_answer_for_the_identical_question(
    pair: Pair,
) -> None:
    one, two = pair
    text = unique("What does the warranty cover?")
    answered(await ask(one, text, "acme"))
    assert answered(await ask(two, text, "acme"))["cache"] == "exact"  # it is cached
    for client in (one, two):
        theirs = answered(await ask(client, text, "globex"))
        assert theirs["cache"] == "miss"
        assert not {c["doc_id"] for c in theirs["citations"]} & {"errors.md", "warranty.txt"}


async def test_a_document_change_retires_the_tenants_cached_answers(pair: Pair) -> None:
    one, two = pair
    text = unique("How long do Acme replacement units take to ship?")
    answered(await ask(one, text))
    assert answered(await ask(two, text))["cache"] == "exact"
    # Each replica here has its own embedded index, so the change goes to both (with
    # OpenSearch the fleet shares one index and one generation).
    doc = f"shipping-{uuid.uuid4().hex[:6]}"
    document = {"title": "Shipping", "text": "Acme replacement units now ship within two days."}
    for client in pair:
        async with client.put(f"/v1/documents/{doc}", json=document, headers=auth()) as put:
            assert put.status in (200, 201), await put.text()
    assert answered(await ask(one, text))["cache"] == "miss"
    assert answered(await ask(two, text))["cache"] == "exact"  # the answer computed after it


async def test_concurrent_identical_questions_on_both_gateways_make_one_model_call(
    pair: Pair, fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    text = scripted(unique("Why does ERR-5120 appear on Acme routers?"), key=key, delay_ms=1500)
    resps = await asyncio.gather(*(ask(client, text) for client in [one, two] * 3))
    bodies = [answered(r) for r in resps]
    assert await calls_for(fake_upstream, key) == 1
    assert sorted(b["cache"] for b in bodies) == ["exact"] * 5 + ["miss"]
    assert len({b["answer"] for b in bodies}) == 1


async def test_no_cache_answers_afresh_over_http(pair: Pair, fake_upstream: str) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    text = scripted(unique("How do I restore a signed Acme backup?"), key=key)
    answered(await ask(one, text))
    assert answered(await ask(two, text, headers=NO_CACHE))["cache"] == "miss"
    assert await calls_for(fake_upstream, key) == 2
    assert answered(await ask(two, text))["cache"] == "exact"


async def test_a_streamed_answer_is_stored_and_replayed_as_a_stream_by_the_other_gateway(
    pair: Pair, fake_upstream: str
) -> None:
    one, two = pair
    key = uuid.uuid4().hex
    answer = "Renew the upstream certificate, then run acme-cli reload {cite:1}. It clears."
    text = scripted(unique("How is ERR-4471 cleared on Acme routers?"), key=key, answer=answer)
    first = events(await ask(one, text, stream=True))
    done = json.loads(next(e for e in first if e.startswith("event: done")).split("data: ")[1])
    assert done["cache"] == "miss"
    replay = events(await ask(two, text, stream=True))
    deltas = [e for e in replay if e.startswith("event: delta")]
    body = json.loads(next(e for e in replay if e.startswith("event: done")).split("data: ")[1])
    assert body["cache"] == "exact"
    assert len(deltas) > 1
    streamed = "".join(json.loads(d.split("data: ", 1)[1])["text"] for d in deltas)
    assert streamed == body["answer"] == done["answer"]
    assert await calls_for(fake_upstream, key) == 1


async def test_the_openai_endpoint_says_which_tier_answered_streamed_or_not(pair: Pair) -> None:
    one, two = pair
    text = unique("What does the Acme warranty exclude?")
    chat = {"model": "lookup", "messages": [{"role": "user", "content": text}]}
    url = "/v1/chat/completions"
    first = await post(one, url, chat, "acme", {})
    assert first.status == 200, first.text
    assert first.json()["querygate"]["cache"] == "miss"
    again = await post(two, url, chat, "acme", {})
    assert again.status == 200, again.text
    assert again.json()["querygate"]["cache"] == "exact"
    streamed = await post(two, url, {**chat, "stream": True}, "acme", {})
    chunks = [e.removeprefix("data: ") for e in events(streamed)]
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed if c["choices"])
    assert content == again.json()["choices"][0]["message"]["content"]
    final = next(c for c in parsed if c.get("querygate"))
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["querygate"]["cache"] == "exact"


async def test_a_system_message_or_an_earlier_turn_is_part_of_what_is_cached(pair: Pair) -> None:
    one, two = pair
    text = unique("What does the Acme warranty cover?")

    async def chat(client: Client, *before: dict[str, str]) -> str:
        body = {"model": "lookup", "messages": [*before, {"role": "user", "content": text}]}
        resp = await post(client, "/v1/chat/completions", body, "acme", {})
        assert resp.status == 200, resp.text
        cache: str = resp.json()["querygate"]["cache"]
        return cache

    french = {"role": "system", "content": "Answer only in French."}
    turn = {"role": "user", "content": "I bought an Acme router in 2021."}
    reply = {"role": "assistant", "content": "Noted."}
    assert await chat(one) == "miss"
    assert await chat(two, french) == "miss"  # not the answer written without it
    assert await chat(one, turn, reply) == "miss"
    assert await chat(two, french) == "exact"  # the same conversation is cached
    assert await chat(one, turn, reply) == "exact"


async def test_redis_killed_mid_traffic_fails_no_request_and_the_cache_comes_back(
    pair: Pair, module_redis: RedisServer
) -> None:
    one, two = pair
    text = unique("How do I fix ERR-4471 on the Acme router?")
    answered(await ask(one, text))

    async def lookup_errors() -> float:
        scrapes = [await scrape(client) for client in pair]
        return sum(s.value("querygate_cache_lookups_total", result="error") for s in scrapes)

    errors_before = await lookup_errors()
    statuses: list[int] = []
    caches: list[str] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            for client in pair:
                resp = await ask(client, text)
                statuses.append(resp.status)
                if resp.status == 200:
                    caches.append(resp.json()["cache"])

    # Requests go on before, while and after Redis is down: the kill and the restart are
    # made to happen between requests of the two clients.
    running = [asyncio.ensure_future(traffic()) for _ in range(2)]
    await wait_for(lambda: "exact" in caches)
    await asyncio.to_thread(module_redis.kill)
    await wait_for(lambda: caches.count("miss") >= 2)
    await asyncio.to_thread(module_redis.restart)
    served = len(statuses)
    await wait_for(lambda: len(statuses) >= served + 4)
    stop.set()
    await asyncio.gather(*running)
    assert statuses and set(statuses) == {200}
    assert "exact" in caches and "miss" in caches  # before, during
    assert await lookup_errors() > errors_before
    # Back by itself: a new answer is stored and served again. The bound is only the wait for
    # the client to reconnect, sized for a loaded CI machine.
    again = unique("How do I fix ERR-5120 on the Acme router?")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answered(await ask(one, again))
        if answered(await ask(two, again))["cache"] == "exact":
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail("the cache did not come back after Redis restarted")


async def wait_for(done: Any, within_s: float = 60.0) -> None:
    """Until `done()` holds; the bound only stops a test whose traffic stalled."""
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, "the traffic stalled"
        await asyncio.sleep(0.02)
