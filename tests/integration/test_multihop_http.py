"""The multihop route over HTTP, in process (`app_client`): litellm's real client path to the
fake upstream, a real embedded index. Streams stay open through the agent's silent
steps (SSE comments), carry only the final answer as text, and end with usage and citations."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.fixtures.app import Client, OpenClient, auth, scrape
from tests.fixtures.upstream import calls_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

AUTH = auth()
KEEPALIVE_S = 0.2


@pytest.fixture(scope="module")
async def client(app_client: OpenClient, fake_upstream: str) -> Client:
    tier = {"api_base": fake_upstream, "retries": 0, "input_cost_per_token": 1e-6}
    return await app_client(
        upstream=fake_upstream,
        server={"sse_keepalive_s": KEEPALIVE_S},
        models={
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        cache={"backend": "off"},
        router={"escalation": {"enabled": False}},  # the routes here are forced
    )


def slow_script(**final: Any) -> dict[str, Any]:
    """Two silent tool turns, each slower than the keep-alive interval, then the answer."""
    search = {"name": "search", "arguments": {"query": "Acme warranty"}, "id": "s"}
    again = {"name": "search", "arguments": {"query": "Acme shipping"}, "id": "t"}
    return {
        "key": uuid.uuid4().hex,
        "delay_ms": 500,
        "turns": [
            {"tool_calls": [search]},
            {"tool_calls": [again]},
            {"answer": "Two years {cite:1}.", **final},
        ],
    }


def question(script: dict[str, Any]) -> str:
    return f"How long is the Acme warranty? [[fake:{json.dumps(script)}]]"


async def test_a_streamed_agent_answer_keeps_the_connection_alive_then_ends_with_the_body(
    client: Client, fake_upstream: str
) -> None:
    script = slow_script()
    body = {"query": question(script), "route": "multihop", "stream": True, "debug": True}
    resp = await client.post("/v1/query", json=body, headers=AUTH)
    assert resp.status == 200
    raw = (await resp.read()).decode()
    assert raw.count(": keep-alive") >= 2
    events = [e for e in raw.split("\n\n") if e.startswith("event:")]
    kinds = [e.split("\n")[0].removeprefix("event: ") for e in events]
    assert kinds == ["delta", "done"]  # the tool turns never reach the client as text
    delta = json.loads(events[0].split("data: ", 1)[1])
    assert delta == {"text": "Two years [1]."}
    done = json.loads(events[-1].split("data: ", 1)[1])
    assert done["route"] == "multihop"
    assert [c["doc_id"] for c in done["citations"]] == ["warranty.txt"]
    assert done["usage"]["by_tier"]["large"]["prompt_tokens"] > 0
    steps = done["debug"]["agent"]["steps"]
    assert len(steps) == 3
    searched = steps[0]["tool_calls"][0]
    assert searched["arguments"] == {"query": "Acme warranty"}
    assert searched["chunk_ids"][0] == "warranty.txt#0"
    assert {"chunk_id", "similarity", "kept"} <= set(searched["grades"][0])
    assert steps[0]["usage"]["prompt_tokens"] > 0 and steps[0]["model_ms"] > 0
    assert await calls_for(fake_upstream, script["key"]) == 3


async def test_the_chat_endpoint_streams_the_agent_answer_in_openai_chunks(
    client: Client,
) -> None:
    body = {
        "model": "multihop",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": question(slow_script())}],
    }
    resp = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert resp.status == 200
    lines = (await resp.read()).decode().split("\n")
    data = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Two years [1]."
    final = next(c for c in chunks if "querygate" in c)
    assert final["querygate"]["route"] == "multihop"
    assert chunks[-1]["usage"]["prompt_tokens"] > 0


async def test_a_model_failure_mid_loop_ends_the_open_stream_with_a_degraded_answer(
    client: Client,
) -> None:
    script = slow_script()
    script["turns"][1] = {**script["turns"][1], "status": 400}  # refused: no retry, no fallback
    script["final"] = {"answer": "Two years {cite:1}.", "delay_ms": 0}  # the small tier's call
    body = {"query": question(script), "route": "multihop", "stream": True}
    resp = await client.post("/v1/query", json=body, headers=AUTH)
    assert resp.status == 200  # the headers had gone out with the first keep-alive
    raw = (await resp.read()).decode()
    assert ": keep-alive" in raw
    assert "event: error" not in raw
    events = [e for e in raw.split("\n\n") if e.startswith("event:")]
    assert [e.split("\n")[0].removeprefix("event: ") for e in events] == ["delta", "done"]
    assert json.loads(events[0].split("data: ", 1)[1]) == {"text": "Two years [1]."}
    done = json.loads(events[-1].split("data: ", 1)[1])
    # cited from the passages the search found, and marked: in route_reason and a metric
    assert [c["doc_id"] for c in done["citations"]] == ["warranty.txt"]
    assert "degraded: the large tier failed mid-loop (request refused)" in done["route_reason"]
    assert done["usage"]["by_tier"]["small"]["prompt_tokens"] > 0
    metrics = await scrape(client)
    assert metrics.value("querygate_agent_degraded_total", answer="fallback_tier") >= 1


async def test_a_model_failure_before_anything_was_found_ends_the_open_stream_with_an_error(
    client: Client,
) -> None:
    script = slow_script()
    script["turns"][0] = {**script["turns"][0], "status": 400}  # nothing searched yet
    body = {"query": question(script), "route": "multihop", "stream": True}
    resp = await client.post("/v1/query", json=body, headers=AUTH)
    assert resp.status == 200  # the headers had gone out with the first keep-alive
    raw = (await resp.read()).decode()
    assert ": keep-alive" in raw
    assert "event: done" not in raw
    event = raw.split("event: error\ndata: ", 1)[1].split("\n", 1)[0]
    # a stable message, never the library's exception text (litellm's, the upstream's body)
    assert json.loads(event) == {
        "error": {"type": "upstream_error", "message": "the model's upstream failed; try again"}
    }


async def test_a_fast_failure_keeps_its_status(client: Client) -> None:
    script = {"key": uuid.uuid4().hex, "status": 400}
    body = {"query": question(script), "route": "multihop", "stream": True}
    resp = await client.post("/v1/query", json=body, headers=AUTH)
    assert resp.status in (502, 503), await resp.text()
    assert (await resp.json())["error"]["type"]


async def test_a_degraded_answer_says_so_in_a_field_a_client_can_read(
    client: Client,
) -> None:
    """Not only in route_reason's prose: `degraded` is null, `fallback_tier` or `extractive`."""
    script = slow_script()
    script["delay_ms"] = 0
    script["turns"][1] = {**script["turns"][1], "status": 400}
    script["final"] = {"answer": "Two years {cite:1}."}
    resp = await client.post(
        "/v1/query", json={"query": question(script), "route": "multihop"}, headers=AUTH
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["degraded"] == "fallback_tier"
    script["key"] = uuid.uuid4().hex
    chat = {"model": "multihop", "messages": [{"role": "user", "content": question(script)}]}
    resp = await client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["querygate"]["degraded"] == "fallback_tier"
    healthy = {"key": uuid.uuid4().hex, "turns": [{"answer": "Two years."}]}
    resp = await client.post(
        "/v1/query", json={"query": question(healthy), "route": "multihop"}, headers=AUTH
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["degraded"] is None
