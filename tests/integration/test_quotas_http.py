"""Rate limits and budgets over HTTP, in process (`app_client`; per-process store: no Redis
configured), litellm's real client path to the fake upstream pricing each call."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from gateway.settings import hash_api_key
from tests.fixtures.app import Client, OpenClient, scrape
from tests.fixtures.upstream import calls_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Each test has its own tenant, so none sees another's bucket or spend.
BUDGET = {"daily_budget_usd": 0.0025}  # a call below costs 0.001: three calls, then refused
RATE = {"rate_limit": {"requests_per_s": 0.01, "burst": 2}}
TENANTS: dict[str, dict[str, Any]] = {
    "spender": BUDGET,
    "streamer": BUDGET,
    "bystander": {**BUDGET, **RATE},
    "agent": {"daily_budget_usd": 0.0015},
    "rewriter": {"daily_budget_usd": 0.0015},
    "streaming-agent": {"daily_budget_usd": 0.0015},
    "burster": RATE,
    "exhausted": BUDGET,
    "metered": BUDGET,
    "hanger": {"daily_budget_usd": 0.00005},  # 50 prompt tokens
}


KEEPALIVE_S = 1.0


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant}"}


@pytest.fixture(scope="module")
async def client(app_client: OpenClient, fake_upstream: str) -> Client:
    tier = {
        "api_base": fake_upstream,
        "retries": 0,
        "input_cost_per_token": 1e-6,
        "output_cost_per_token": 0.0,
    }
    return await app_client(
        upstream=fake_upstream,
        corpora={"agent": "acme"},
        # A stream opens (keep-alives) when its answer takes longer than this.
        server={"sse_keepalive_s": KEEPALIVE_S},
        tenants=[
            {"id": name, "api_key_sha256": hash_api_key(f"key-{name}"), **limits}
            for name, limits in TENANTS.items()
        ],
        models={
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        cache={"backend": "off"},
        # the questions here force their route
        router={"classifier": "heuristic", "escalation": {"enabled": False}},
    )


def priced(key: str, prompt_tokens: int = 1000, **script: Any) -> str:
    """A question whose model call costs prompt_tokens * 1e-6 USD."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0}
    directive = {"key": key, "usage": usage, **script}
    return f"Say hello. {uuid.uuid4().hex[:6]} [[fake:{json.dumps(directive)}]]"


async def ask(
    client: Client, tenant: str, query: str, **body: Any
) -> tuple[int, dict[str, str], Any]:
    payload = {"query": query, "route": "direct", **body}
    async with client.post("/v1/query", json=payload, headers=auth(tenant)) as resp:
        raw = await resp.read()
        is_json = resp.content_type == "application/json"
        return resp.status, dict(resp.headers), json.loads(raw) if is_json else raw.decode()


async def test_a_spent_budget_refuses_the_next_question_naming_it_before_any_model_call(
    client: Client, fake_upstream: str
) -> None:
    key = uuid.uuid4().hex
    for _ in range(3):  # 0, 0.001, 0.002 spent before each: under 0.0025
        status, _, body = await ask(client, "spender", priced(key))
        assert status == 200, body
        assert body["usage"]["cost_usd"] == pytest.approx(0.001)
    status, headers, body = await ask(client, "spender", priced(key))
    assert status == 429
    assert 1 <= int(headers["Retry-After"]) <= 86_400  # until 00:00 UTC
    assert body["error"]["type"] == "budget_exceeded"
    assert "daily budget of $0.0025 (daily_budget_usd)" in body["error"]["message"]
    assert await calls_for(fake_upstream, key) == 3  # the refused one never reached the model


async def test_a_stream_refused_before_it_starts_is_a_plain_429(
    client: Client, fake_upstream: str
) -> None:
    key = uuid.uuid4().hex
    for _ in range(3):
        status, _, _ = await ask(client, "streamer", priced(key), stream=True)
        assert status == 200
    status, headers, body = await ask(client, "streamer", priced(key), stream=True)
    assert status == 429
    assert headers["Content-Type"].startswith("application/json")  # not an event stream
    assert int(headers["Retry-After"]) >= 1
    assert body["error"]["type"] == "budget_exceeded"
    assert await calls_for(fake_upstream, key) == 3  # streamed calls were recorded too


async def test_a_stream_whose_own_rewrite_spent_the_budget_is_still_a_plain_429(
    client: Client, fake_upstream: str
) -> None:
    key = uuid.uuid4().hex
    history = [
        {"role": "user", "content": "Tell me about the Acme router."},
        {"role": "assistant", "content": "It is a home router."},
    ]
    directive = {"key": key, "usage": {"prompt_tokens": 2000, "completion_tokens": 0}}
    query = f"And its warranty? [[fake:{json.dumps(directive)}]]"  # the rewrite spends 0.002
    status, headers, body = await ask(client, "rewriter", query, history=history, stream=True)
    assert status == 429
    assert headers["Content-Type"].startswith("application/json")
    assert body["error"]["type"] == "budget_exceeded"
    assert await calls_for(fake_upstream, key) == 1  # the rewrite; the answer was never asked


async def test_a_tenant_at_its_limits_never_limits_another(
    client: Client,
) -> None:
    # "exhausted" spends its budget here, in one call; "bystander" has the same budget.
    status, _, body = await ask(client, "exhausted", priced(uuid.uuid4().hex, 3000))
    assert status == 200, body
    assert (await ask(client, "exhausted", priced(uuid.uuid4().hex)))[0] == 429
    for _ in range(2):
        status, _, body = await ask(client, "bystander", priced(uuid.uuid4().hex))
        assert status == 200, body
    assert (await ask(client, "exhausted", priced(uuid.uuid4().hex)))[0] == 429


async def test_over_the_rate_limit_is_429_with_retry_after_before_the_body_is_read(
    client: Client,
) -> None:
    for _ in range(2):  # the burst
        async with client.post("/v1/route", json={"query": "hi"}, headers=auth("burster")) as r:
            assert r.status == 200
    # Not even valid JSON: the limit is taken before the body is read or parsed.
    async with client.post("/v1/route", data=b"{not json", headers=auth("burster")) as resp:
        assert resp.status == 429
        retry_after = resp.headers["Retry-After"]
        body = await resp.json()
    assert retry_after.isdigit() and 90 <= int(retry_after) <= 100  # one token per 100 s
    assert body["error"]["type"] == "rate_limit_exceeded"
    assert "rate limit of 0.01 requests/s (burst 2)" in body["error"]["message"]
    got = (await scrape(client)).samples()
    assert got[("querygate_quota_refusals_total", (("reason", "rate_limit"),))] >= 1
    endpoint = (("endpoint", "POST /v1/route"), ("outcome", "rate_limited"))
    assert got[("querygate_http_requests_total", endpoint)] >= 1


async def test_an_agent_whose_budget_runs_out_stops_at_its_next_call_with_429(
    client: Client, fake_upstream: str
) -> None:
    key = uuid.uuid4().hex
    search = {"name": "search", "arguments": {"query": "Acme warranty"}, "id": "s"}
    turns = [{"tool_calls": [search]}, {"answer": "Two years {cite:1}."}]
    query = priced(key, prompt_tokens=2000, turns=turns)  # the first turn spends 0.002
    status, _, body = await ask(client, "agent", query, route="multihop")
    assert status == 429
    assert body["error"]["type"] == "budget_exceeded"
    assert await calls_for(fake_upstream, key) == 1  # the second turn was never sent


async def test_an_agent_stream_already_open_ends_with_a_budget_error_event(
    client: Client, fake_upstream: str
) -> None:
    key = uuid.uuid4().hex
    search = {"name": "search", "arguments": {"query": "Acme warranty"}, "id": "s"}
    slow = int(KEEPALIVE_S * 1500)  # the first turn outlasts the keep-alive: the stream opens
    turns = [{"tool_calls": [search], "delay_ms": slow}, {"answer": "Two years {cite:1}."}]
    query = priced(key, prompt_tokens=2000, turns=turns)
    status, headers, raw = await ask(
        client, "streaming-agent", query, route="multihop", stream=True
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert ": keep-alive" in raw
    events = [e for e in raw.split("\n\n") if e.startswith("event:")]
    assert [e.split("\n")[0] for e in events] == ["event: error"]
    error = json.loads(events[0].split("data: ", 1)[1])["error"]
    assert error["type"] == "budget_exceeded"
    assert await calls_for(fake_upstream, key) == 1
    got = (await scrape(client)).samples()
    outcome = (("endpoint", "POST /v1/query"), ("outcome", "budget_exceeded"))
    assert got[("querygate_http_requests_total", outcome)] >= 1


async def test_quota_metrics_name_no_tenant(client: Client) -> None:
    # A refusal of its own: the metrics exist whichever tests ran before.
    assert (await ask(client, "metered", priced(uuid.uuid4().hex, 3000)))[0] == 200
    assert (await ask(client, "metered", priced(uuid.uuid4().hex)))[0] == 429
    got = (await scrape(client)).samples()
    quota = [labels for name, labels in got if name.startswith("querygate_quota_")]
    assert quota  # else the check below passes vacuously
    assert {k for labels in quota for k, _ in labels} <= {"reason", "check"}
    assert ("querygate_quota_refusals_total", (("reason", "budget"),)) in got


async def test_a_stream_the_client_hangs_up_on_is_charged_what_it_used(
    client: Client, fake_upstream: str
) -> None:
    async def cost() -> float:
        return (await scrape(client)).value("querygate_llm_cost_usd_total")

    before = await cost()
    directive = {"key": uuid.uuid4().hex, "chunk_delay_ms": 200, "answer": "word " * 60}
    query = f"Say hello. [[fake:{json.dumps(directive)}]]"
    payload = {"query": query, "route": "direct", "stream": True}
    async with client.post("/v1/query", json=payload, headers=auth("hanger")) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"event: delta"):
                break
        resp.close()  # the client hangs up before the usage chunk
    for _ in range(50):  # the server notices at its next write
        if await cost() > before:
            break
        await asyncio.sleep(0.1)
    charged = await cost() - before
    assert charged >= 0.00005  # the prompt (hundreds of tokens at 1e-6) plus the text so far
    status, _, body = await ask(client, "hanger", priced(uuid.uuid4().hex, prompt_tokens=1))
    assert status == 429, body  # the cut call was charged to the budget too
    assert body["error"]["type"] == "budget_exceeded"
