"""Every OpenAI parameter of `POST /v1/chat/completions` is honoured or refused by name.

In process (`app_client`) over litellm's real client to the fake upstream, which records the
parameters of the last chat request carrying each directive key (`params_by_key` in its
/admin/stats): what it shows is what reached the model.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from tests.fixtures.app import Client, LogLines, OpenClient, auth
from tests.fixtures.upstream import calls_for, upstream_stats

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
async def gateway(app_client: OpenClient, fake_upstream: str) -> Client:
    """The suite's configuration with both tiers on the fake upstream."""
    return await app_client(upstream=fake_upstream)


@pytest.fixture(scope="module")
async def extractive(app_client: OpenClient) -> Client:
    """The suite's configuration with no model: answers are extractive."""
    return await app_client()


class Reply:
    """One response, read whole."""

    def __init__(self, status: int, text: str, headers: Mapping[str, str]) -> None:
        self.status_code, self.text, self.headers = status, text, headers

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    def json(self) -> Any:
        return json.loads(self.text)


def key() -> str:
    # letters only: a key that looks like an identifier (digits) would send a question to lookup
    return "params" + "".join(random.choice(string.ascii_lowercase) for _ in range(12))


def ask(text: str, directive: dict[str, Any]) -> list[dict[str, str]]:
    """One user message carrying the fake's directive (a fresh key: never a cached answer)."""
    return [{"role": "user", "content": f"{text} [[fake:{json.dumps(directive)}]]"}]


async def chat(gw: Client, **body: Any) -> Reply:
    async with gw.post("/v1/chat/completions", headers=auth(), json=body) as resp:
        return Reply(resp.status, await resp.text(), resp.headers.copy())


async def received(upstream: str, k: str) -> dict[str, Any]:
    """The parameters the upstream got with the last chat request carrying key `k`."""
    params: dict[str, Any] = (await upstream_stats(upstream))["params_by_key"][k]
    return params


async def route_of(gw: Client, text: str) -> str:
    async with gw.post("/v1/route", headers=auth(), json={"query": text}) as resp:
        assert resp.status == 200
        route: str = (await resp.json())["route"]
        return route


SAMPLING: dict[str, Any] = {
    "temperature": 0.3,
    "top_p": 0.9,
    "seed": 7,
    "stop": ["END", "STOP"],
    "frequency_penalty": 0.5,
    "presence_penalty": 0.25,
}


async def test_sampling_parameters_reach_the_direct_routes_model_call(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    resp = await chat(gateway, model="direct", messages=ask("Hello", {"key": k}), **SAMPLING)
    assert resp.status_code == 200, resp.text
    got = await received(fake_upstream, k)
    assert {name: got.get(name) for name in SAMPLING} == SAMPLING


async def test_sampling_parameters_reach_the_lookup_routes_answer_call(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    text = "How do I fix ERR-4471?"
    resp = await chat(gateway, model="lookup", messages=ask(text, {"key": k}), **SAMPLING)
    assert resp.status_code == 200, resp.text
    assert resp.json()["querygate"]["citations"], resp.json()  # it answered from sources
    got = await received(fake_upstream, k)
    assert {name: got.get(name) for name in SAMPLING} == SAMPLING


async def test_max_completion_tokens_caps_the_answer_and_says_length(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    messages = ask("Hello", {"key": k, "answer": "one two three four five six seven"})
    resp = await chat(gateway, model="direct", messages=messages, max_completion_tokens=3)
    assert resp.status_code == 200, resp.text
    assert (await received(fake_upstream, k))["max_tokens"] == 3
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "one two three"


async def test_max_tokens_below_the_tiers_limit_wins_and_above_it_does_not(
    gateway: Client, fake_upstream: str
) -> None:
    low, high = key(), key()
    assert (await chat(gateway, model="direct", messages=ask("Hi", {"key": low}), max_tokens=40)).ok
    huge = 10**6
    assert (
        await chat(gateway, model="direct", messages=ask("Hi", {"key": high}), max_tokens=huge)
    ).ok
    assert (await received(fake_upstream, low))["max_tokens"] == 40
    assert (await received(fake_upstream, high))["max_tokens"] == 512  # the tier's own (TierConfig)


async def test_n_above_one_is_refused_naming_n_and_n_one_is_fine(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    resp = await chat(gateway, model="direct", messages=ask("Hello", {"key": k}), n=2)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("n: ")
    assert await calls_for(fake_upstream, k) == 0
    one = await chat(gateway, model="direct", messages=ask("Hello", {"key": k}), n=1)
    assert one.status_code == 200


async def test_unsupported_and_unknown_parameters_are_each_named_and_nothing_runs(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    resp = await chat(
        gateway,
        model="auto",
        messages=ask("Hello", {"key": k}),
        logprobs=True,
        logit_bias={"50256": -100},
        functions=[{"name": "f", "parameters": {}}],
        made_up_param=1,
    )
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    for name in ("logprobs", "logit_bias", "functions", "made_up_param"):
        assert f"{name}: " in message, message
    assert await calls_for(fake_upstream, k) == 0


async def test_parameters_at_the_value_that_asks_for_nothing_are_accepted(
    gateway: Client,
) -> None:
    resp = await chat(
        gateway,
        model="direct",
        messages=ask("Hello", {"key": key()}),
        n=1,
        logprobs=False,
        store=False,
        service_tier="auto",
        logit_bias=None,
    )
    assert resp.status_code == 200, resp.text


async def test_client_tools_on_direct_come_back_as_openai_tool_calls(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    script = {"key": k, "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
    resp = await chat(
        gateway,
        model="direct",
        messages=ask("What is the weather in Oslo?", script),
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
    )
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    got = await received(fake_upstream, k)
    assert got["tools"] == [WEATHER_TOOL]
    assert (got["tool_choice"], got["parallel_tool_calls"]) == ("auto", False)


async def test_streamed_tool_calls_come_back_in_chunks_with_finish_reason_tool_calls(
    gateway: Client,
) -> None:
    script = {"key": key(), "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]}
    resp = await chat(
        gateway,
        model="direct",
        messages=ask("Weather in Rome?", script),
        tools=[WEATHER_TOOL],
        stream=True,
    )
    assert resp.status_code == 200
    lines = resp.text.splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in events if c.get("choices")]
    calls_seen = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in calls_seen] == ["get_weather"]
    assert json.loads(calls_seen[0]["function"]["arguments"]) == {"city": "Rome"}
    finishes = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
    assert finishes[-1] == "tool_calls"


async def test_tools_on_a_route_that_answers_from_documents_are_refused_before_any_call(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    resp = await chat(
        gateway,
        model="lookup",
        messages=ask("How do I fix ERR-4471?", {"key": k}),
        tools=[WEATHER_TOOL],
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("tools: the question was routed to lookup")
    assert await calls_for(fake_upstream, k) == 0


async def test_tools_with_auto_pass_through_when_it_routes_direct_and_are_refused_otherwise(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    # Text to transform carries the fake's directive: small talk the policy answers directly.
    direct_text = ask("Translate this into French: thank you so much, bye", {"key": k})[0][
        "content"
    ]
    lookup_text = "How do I fix ERR-4471?"
    assert await route_of(gateway, direct_text) == "direct"  # what the two cases rest on
    assert await route_of(gateway, lookup_text) == "lookup"
    resp = await chat(
        gateway,
        model="auto",
        messages=[{"role": "user", "content": direct_text}],
        tools=[WEATHER_TOOL],
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["querygate"]["route"] == "direct"
    assert (await received(fake_upstream, k))["tools"] == [WEATHER_TOOL]
    refused = await chat(
        gateway,
        model="auto",
        messages=[{"role": "user", "content": lookup_text}],
        tools=[WEATHER_TOOL],
    )
    assert refused.status_code == 400
    assert "tools: the question was routed to lookup" in refused.json()["error"]["message"]


async def test_response_format_passes_through_on_direct_and_is_refused_on_lookup(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    schema = {"name": "city", "schema": {"type": "object"}, "strict": True}
    response_format = {"type": "json_schema", "json_schema": schema}
    messages = ask("Name a city", {"key": k, "answer": '{"city": "Oslo"}'})
    resp = await chat(gateway, model="direct", messages=messages, response_format=response_format)
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) == {"city": "Oslo"}
    assert (await received(fake_upstream, k))["response_format"] == response_format
    refused = await chat(
        gateway,
        model="lookup",
        messages=ask("How do I fix ERR-4471?", {"key": key()}),
        response_format={"type": "json_object"},
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("response_format: ")


async def test_a_response_format_of_text_is_what_every_answer_is_anyway(gateway: Client) -> None:
    resp = await chat(
        gateway,
        model="lookup",
        messages=ask("How do I fix ERR-4471?", {"key": key()}),
        response_format={"type": "text"},
    )
    assert resp.status_code == 200, resp.text


async def test_tool_results_sent_back_continue_the_conversation_on_direct(
    gateway: Client,
) -> None:
    # turn 2 (one assistant message after the question) answers: the fake sees the trailing
    # tool call and result after the question, in order, or it would call the tool again
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_oslo"}
    script = {"key": key(), "turns": [{"tool_calls": [call]}, {"answer": "Sunny in Oslo."}]}
    question = ask("Weather in Oslo?", script)
    first = await chat(gateway, model="direct", messages=question, tools=[WEATHER_TOOL])
    assert first.status_code == 200, first.text
    assistant = first.json()["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "call_oslo", "content": "sunny, 21 C"}
    second = await chat(
        gateway, model="direct", messages=[*question, assistant, result], tools=[WEATHER_TOOL]
    )
    assert second.status_code == 200, second.text
    choice = second.json()["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", "Sunny in Oslo.")


async def test_tool_results_on_a_route_that_answers_from_documents_are_refused(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        *ask("How do I fix ERR-4471?", {"key": k}),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    resp = await chat(gateway, model="lookup", messages=messages)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("messages: the question was routed to lookup")
    assert await calls_for(fake_upstream, k) == 0


async def test_a_conversation_ending_in_anything_but_a_question_or_tool_results_is_422(
    gateway: Client,
) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    resp = await chat(gateway, model="direct", messages=messages)
    assert resp.status_code == 422
    assert resp.json()["error"]["message"].startswith("messages: ")


async def test_a_request_with_parameters_is_answered_afresh_not_from_the_cache(
    gateway: Client, fake_upstream: str
) -> None:
    k = key()
    for _ in range(2):
        resp = await chat(
            gateway, model="direct", messages=ask("Hello", {"key": k}), temperature=0.5
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["querygate"]["cache"] == "miss"
    assert await calls_for(fake_upstream, k) == 2


async def test_user_goes_to_the_request_log_line(gateway: Client, gateway_log: LogLines) -> None:
    user = f"end-user-{uuid.uuid4().hex[:8]}"
    resp = await chat(gateway, model="direct", messages=ask("Hello", {"key": key()}), user=user)
    assert resp.status_code == 200, resp.text
    lines = await gateway_log.request_lines(resp.headers["X-Request-Id"])
    assert [line.get("user") for line in lines if line.get("msg") == "request"] == [user]


async def test_tools_on_a_deployment_without_a_model_are_refused(extractive: Client) -> None:
    resp = await chat(extractive, model="direct", messages=ask("Hello", {}), tools=[WEATHER_TOOL])
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("tools: no model is configured")


@pytest.mark.parametrize(
    "arguments",
    [
        '{"city": "Os',
        # JSON Python's parser cannot hold (RecursionError, ValueError): these gave a 500
        '{"city": ' + "[" * 3000,
        '{"city": ' + "9" * 5000 + "}",
    ],
    ids=["cut", "nested-too-deeply", "5000-digits"],
)
async def test_a_models_malformed_tool_arguments_reach_the_client_verbatim(
    gateway: Client, arguments: str
) -> None:
    script = {"key": key(), "tool_calls": [{"name": "get_weather", "arguments": arguments}]}
    resp = await chat(
        gateway,
        model="direct",
        messages=ask("Weather in Oslo?", script),
        tools=[WEATHER_TOOL],
    )
    assert resp.status_code == 200, resp.text
    call = resp.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == arguments


@pytest.mark.parametrize("stream", [False, True])
async def test_a_model_refusing_the_clients_parameters_as_invalid_is_a_400_not_a_503(
    gateway: Client, fake_upstream: str, gateway_log: LogLines, stream: bool
) -> None:
    """An upstream's 400 to a request the client shaped (a seed out of its range, a tool schema
    it rejects) was a 503 upstream_error with Retry-After: the client retried a request that
    can never pass, and its refusals counted against the gateway's error-rate alert."""
    k = key()
    resp = await chat(
        gateway,
        model="direct",
        messages=ask("Hello", {"key": k, "status": 400}),
        temperature=0.3,
        stream=stream,
    )
    if stream:
        assert resp.status_code == 200, resp.text
        events = [json.loads(line[6:]) for line in resp.text.splitlines() if line[6:8] == '{"']
        error = events[-1]["error"]
    else:
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
    assert error["type"] == "bad_request"
    assert error["message"].startswith("the model refused this request as invalid")
    assert await calls_for(fake_upstream, k) == 1  # not retried
    lines = await gateway_log.request_lines(resp.headers["X-Request-Id"])
    [line] = [line for line in lines if line.get("msg") == "request"]
    assert line["outcome"] == "client_error"
    assert any("HTTP 400" in line["msg"] for line in lines)  # the model's reason, logged


@pytest.mark.parametrize(
    ("status", "params"),
    [(400, {}), (401, {"temperature": 0.3}), (404, {"temperature": 0.3})],
    ids=["no-client-parameters", "401-key", "404-model"],
)
async def test_a_refusal_the_client_did_not_cause_stays_a_503(
    gateway: Client, status: int, params: dict[str, Any]
) -> None:
    """Without the client's parameters the request is the gateway's own making, and 401/404
    fault the deployment's key or model name: the operator's to fix, so still 503."""
    resp = await chat(
        gateway, model="direct", messages=ask("Hello", {"key": key(), "status": status}), **params
    )
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["type"] == "upstream_error"


async def test_stream_options_without_stream_is_refused_naming_it(gateway: Client) -> None:
    """It was taken and ignored: `include_usage` asked for a usage chunk no answer had."""
    resp = await chat(
        gateway,
        model="direct",
        messages=ask("Hello", {"key": key()}),
        stream_options={"include_usage": True},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"] == "stream_options: only with stream: true"
