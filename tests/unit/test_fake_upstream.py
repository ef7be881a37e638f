"""The fake upstream's own contract, exercised over HTTP against the real process."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fixtures.upstream import calls_for, upstream_stats

# one loop for the module: the session fixture loop scope (pyproject) must match the tests'
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _key() -> str:
    return uuid.uuid4().hex


def _chat(content: str, directive: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    if directive is not None:
        content = f"{content} [[fake:{json.dumps(directive)}]]"
    return {"model": "fake-small", "messages": [{"role": "user", "content": content}], **extra}


async def _post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kw: Any
) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body, **kw) as resp:
        return resp.status, await resp.json()


async def _sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    raw = (await resp.read()).decode()
    return [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]


async def test_default_answer_echoes_the_question_with_word_count_usage(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    status, body = await _post(http, f"{fake_upstream}/chat/completions", _chat("what is up"))
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "FAKE ANSWER: what is up"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


SOURCES = 'Sources:\n<source id="k7q3x9m2-1">\nParis is in France\n</source>'


async def test_default_answer_cites_the_first_source_the_prompt_delimits(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    body = _chat("q")
    body["messages"].insert(0, {"role": "system", "content": SOURCES})
    _, reply = await _post(http, f"{fake_upstream}/chat/completions", body)
    assert reply["choices"][0]["message"]["content"].endswith(" [k7q3x9m2-1]")


async def test_a_scripted_answer_cites_source_n_with_the_requests_marker(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    with_sources = _chat("q", {"answer": "A {cite:2}."})
    with_sources["messages"].insert(0, {"role": "system", "content": SOURCES})
    _, reply = await _post(http, f"{fake_upstream}/chat/completions", with_sources)
    assert reply["choices"][0]["message"]["content"] == "A [k7q3x9m2-2]."
    _, bare = await _post(
        http, f"{fake_upstream}/chat/completions", _chat("q", {"answer": "{cite:1}"})
    )
    assert bare["choices"][0]["message"]["content"] == "[1]"


async def test_directive_in_message_is_stripped_and_scripts_answer_and_usage(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    directive = {"answer": "forty two", "usage": {"prompt_tokens": 7, "completion_tokens": 9}}
    _, body = await _post(http, f"{fake_upstream}/chat/completions", _chat("q", directive))
    assert body["choices"][0]["message"]["content"] == "forty two"
    assert body["usage"]["prompt_tokens"] == 7
    assert body["usage"]["completion_tokens"] == 9


async def test_no_usage_omits_usage_from_the_body(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    _, body = await _post(http, f"{fake_upstream}/chat/completions", _chat("q", {"no_usage": True}))
    assert "usage" not in body


async def test_header_directive_scripts_a_status(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    headers = {"x-fake": json.dumps({"status": 429})}
    status, body = await _post(
        http, f"{fake_upstream}/chat/completions", _chat("q"), headers=headers
    )
    assert status == 429
    assert body["error"]["type"] == "rate_limit_error"


async def test_fail_first_fails_that_many_attempts_of_a_key_then_answers(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    key = _key()
    directive = {"key": key, "fail_first": 2}
    statuses = [
        (await _post(http, f"{fake_upstream}/chat/completions", _chat("q", directive)))[0]
        for _ in range(3)
    ]
    assert statuses == [503, 503, 200]
    assert await calls_for(fake_upstream, key) == 3


async def test_models_filter_applies_faults_only_to_listed_models(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    directive = {"status": 500, "models": ["fake-small"]}
    small, _ = await _post(http, f"{fake_upstream}/chat/completions", _chat("q", directive))
    other_body = _chat("q", directive) | {"model": "fake-fallback"}
    other, _ = await _post(http, f"{fake_upstream}/chat/completions", other_body)
    assert (small, other) == (500, 200)


async def test_delay_ms_holds_the_first_byte(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    start = time.monotonic()
    await _post(http, f"{fake_upstream}/chat/completions", _chat("q", {"delay_ms": 300}))
    assert time.monotonic() - start >= 0.3


async def test_malformed_body_is_not_json(fake_upstream: str, http: aiohttp.ClientSession) -> None:
    body = _chat("q", {"malformed": True})
    async with http.post(f"{fake_upstream}/chat/completions", json=body) as resp:
        assert resp.status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(await resp.text())


async def test_tool_calls_come_back_in_the_message(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    directive = {"tool_calls": [{"name": "search", "arguments": {"q": "paris"}, "id": "c1"}]}
    _, body = await _post(http, f"{fake_upstream}/chat/completions", _chat("q", directive))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["id"] == "c1"
    assert call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"]) == {"q": "paris"}


async def test_turns_script_a_tool_loop_by_the_assistant_messages_after_the_question(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    directive = {
        "turns": [
            {"tool_calls": [{"name": "search", "arguments": {"query": "a"}, "id": "t0"}]},
            {"answer": "done [1]"},
        ]
    }
    first = _chat("q", directive)
    _, body = await _post(http, f"{fake_upstream}/chat/completions", first)
    assert body["choices"][0]["message"]["tool_calls"][0]["id"] == "t0"
    call = body["choices"][0]["message"]
    second = {
        **first,
        "messages": [
            {"role": "assistant", "content": "earlier history does not count"},
            *first["messages"],
            call,
            {"role": "tool", "tool_call_id": "t0", "content": "result"},
        ],
    }
    for _ in range(2):  # past the list: the last entry again
        _, body = await _post(http, f"{fake_upstream}/chat/completions", second)
        assert body["choices"][0]["message"]["content"] == "done [1]"
        second["messages"] = [*second["messages"], {"role": "assistant", "content": "x"}]


async def test_final_scripts_the_request_that_offers_no_tools(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    directive = {"tool_calls": [{"name": "search", "arguments": {}}], "final": {"answer": "end"}}
    offered = _chat("q", directive, tools=[{"type": "function", "function": {"name": "search"}}])
    _, body = await _post(http, f"{fake_upstream}/chat/completions", offered)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    _, body = await _post(http, f"{fake_upstream}/chat/completions", _chat("q", directive))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "end"}


async def test_stream_sends_chunks_then_usage_chunk_then_done(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    body = _chat("hello there", stream=True, stream_options={"include_usage": True})
    async with http.post(f"{fake_upstream}/chat/completions", json=body) as resp:
        events = await _sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "FAKE ANSWER: hello there"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 4


async def test_stream_without_include_usage_has_no_usage_chunk(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{fake_upstream}/chat/completions", json=_chat("q", stream=True)) as resp:
        events = await _sse_events(resp)
    assert all("usage" not in json.loads(e) for e in events[:-1])


async def test_stream_streams_tool_call_arguments_in_fragments(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    args = {"query": "a fairly long search query"}
    directive = {"tool_calls": [{"name": "search", "arguments": args}]}
    async with http.post(
        f"{fake_upstream}/chat/completions", json=_chat("q", directive, stream=True)
    ) as resp:
        events = await _sse_events(resp)
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1]]
    fragments = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d]
    assert len(fragments) > 2
    assert json.loads("".join(fragments)) == args


async def test_truncated_stream_drops_the_connection_mid_body(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    body = _chat("one two three four", {"truncate_after": 2}, stream=True)
    async with http.post(f"{fake_upstream}/chat/completions", json=body) as resp:
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_chunk_delay_paces_the_stream(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    body = _chat("a b", {"chunk_delay_ms": 50}, stream=True)
    start = time.monotonic()
    async with http.post(f"{fake_upstream}/chat/completions", json=body) as resp:
        events = await _sse_events(resp)
    assert time.monotonic() - start >= 0.05 * (len(events) - 1)


async def test_embeddings_are_deterministic_unit_vectors(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    body = {"model": "fake-embed", "input": ["alpha", "beta", "alpha"], "dimensions": 16}
    status, reply = await _post(http, f"{fake_upstream}/embeddings", body)
    assert status == 200
    vectors = [d["embedding"] for d in reply["data"]]
    assert vectors[0] == vectors[2] != vectors[1]
    assert math.isclose(math.fsum(v * v for v in vectors[0]), 1.0, rel_tol=1e-9)
    assert reply["usage"]["prompt_tokens"] == 3


async def test_embeddings_in_base64_decode_to_the_float_vector(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    floats = {"model": "fake-embed", "input": "x", "dimensions": 8}
    _, as_floats = await _post(http, f"{fake_upstream}/embeddings", floats)
    _, as_b64 = await _post(
        http, f"{fake_upstream}/embeddings", floats | {"encoding_format": "base64"}
    )
    decoded = struct.unpack("<8f", base64.b64decode(as_b64["data"][0]["embedding"]))
    assert decoded == pytest.approx(as_floats["data"][0]["embedding"], rel=1e-6)


async def test_models_and_health(fake_upstream: str, http: aiohttp.ClientSession) -> None:
    root = fake_upstream.removesuffix("/v1")
    async with http.get(f"{fake_upstream}/models") as models, http.get(f"{root}/health") as health:
        assert "fake-small" in {m["id"] for m in (await models.json())["data"]}
        assert (await health.json()) == {"status": "ok"}


async def test_stats_count_requests_by_endpoint_and_key(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    key = _key()
    before = await upstream_stats(fake_upstream)
    await asyncio.gather(
        *(
            _post(http, f"{fake_upstream}/chat/completions", _chat("q", {"key": key}))
            for _ in range(3)
        )
    )
    after = await upstream_stats(fake_upstream)
    assert after["by_key"][key] == 3
    assert after["by_endpoint"]["chat"] - before["by_endpoint"].get("chat", 0) == 3


async def test_rerank_scores_by_token_overlap_best_first_with_billed_units(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    documents = ["Berlin is in Germany", "Paris is the capital of France", "France"]
    body = {"model": "fake-rerank", "query": "capital of France", "documents": documents}
    status, answer = await _post(http, f"{fake_upstream}/rerank", body)
    assert status == 200
    assert [r["index"] for r in answer["results"]] == [1, 2, 0]
    assert [r["relevance_score"] for r in answer["results"]] == [1.0, 1 / 3, 0.0]
    assert answer["meta"]["billed_units"] == {"search_units": 1}
    status, top = await _post(http, f"{fake_upstream}/rerank", body | {"top_n": 1})
    assert [r["index"] for r in top["results"]] == [1]


async def test_rerank_takes_the_directive_from_the_query(
    fake_upstream: str, http: aiohttp.ClientSession
) -> None:
    key = _key()
    query = f'capital [[fake:{{"key": "{key}", "fail_first": 1}}]]'
    body = {"model": "fake-rerank", "query": query, "documents": ["the capital"]}
    first, _ = await _post(http, f"{fake_upstream}/rerank", body)
    second, answer = await _post(http, f"{fake_upstream}/rerank", body)
    assert (first, second) == (503, 200)
    assert answer["results"] == [{"index": 0, "relevance_score": 1.0}]  # the directive stripped
    assert await calls_for(fake_upstream, key) == 2
