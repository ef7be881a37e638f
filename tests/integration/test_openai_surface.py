"""The OpenAI surface has no silent corner: every name `/v1/models` lists is answered by chat
and completions, `/v1/embeddings` is the gateway's own embedder (per tenant, rate limited),
an unknown path or method is a JSON error naming what is served, and without a model the
parameters an extractive answer cannot honour are refused by name. The app in process, with
both tiers (a `FakeLLM`) or none."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from backends.embeddings.base import Embedder
from gateway.settings import hash_api_key
from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, OpenClient, auth
from tests.fixtures.gateway import KEYS

pytestmark = pytest.mark.asyncio(loop_scope="session")

RATED = {"id": "rated", "rate_limit": {"requests_per_s": 0.01, "burst": 1}}


@pytest.fixture(scope="module")
async def generating(app_client: OpenClient) -> Client:
    return await app_client(llm=FakeLLM())


@pytest.fixture(scope="module")
async def extractive(app_client: OpenClient) -> Client:
    tenants = [
        {"id": "acme", "api_key_sha256": hash_api_key(KEYS["acme"])},
        {**RATED, "api_key_sha256": hash_api_key("key-rated")},
    ]
    return await app_client(tenants=tenants)


async def post(client: Client, path: str, body: Any, key: str = KEYS["acme"]) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with client.post(path, headers=headers, json=body) as resp:
        return resp.status, await resp.json()


def chat_body(model: str, text: str, **params: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **params}


# -- every listed model is answered ---------------------------------------------------------


async def test_without_a_large_model_multihop_is_listed_as_answered_by_lookup(
    extractive: Client,
) -> None:
    async with extractive.get("/v1/models", headers=auth()) as resp:
        body = await resp.json()
    listed = {m["id"]: m for m in body["data"]}
    assert list(listed) == ["auto", "direct", "lookup", "multihop"]
    assert listed["multihop"]["querygate"]["answered_by"] == "lookup"
    assert "querygate" not in listed["lookup"]


async def test_every_listed_model_is_answered_by_chat_and_completions(
    extractive: Client,
) -> None:
    async with extractive.get("/v1/models", headers=auth()) as resp:
        names = [m["id"] for m in (await resp.json())["data"]]
    for name in names:
        status, body = await post(extractive, "/v1/chat/completions", chat_body(name, "Warranty?"))
        assert status == 200, (name, body)
        status, body = await post(extractive, "/v1/completions", {"model": name, "prompt": "Hi?"})
        assert status == 200, (name, body)


async def test_forced_multihop_on_chat_is_answered_as_v1_query_answers_it(
    extractive: Client,
) -> None:
    question = "What does the Acme warranty exclude?"
    status, queried = await post(extractive, "/v1/query", {"query": question, "route": "multihop"})
    assert status == 200, queried
    forced = chat_body("multihop", question)
    status, chatted = await post(extractive, "/v1/chat/completions", forced)
    assert status == 200, chatted
    extra = chatted["querygate"]
    assert (extra["route"], extra["route_reason"]) == (queried["route"], queried["route_reason"])
    assert extra["route"] == "lookup"
    assert "multihop route is not available in this deployment" in extra["route_reason"]
    assert chatted["model"] == "multihop"
    assert chatted["choices"][0]["message"]["content"] == queried["answer"]


async def test_a_name_that_is_no_route_is_404_naming_the_models(extractive: Client) -> None:
    status, body = await post(extractive, "/v1/chat/completions", chat_body("gpt-4o", "hi"))
    assert status == 404
    assert "use one of auto, direct, lookup, multihop" in body["error"]["message"]
    status, body = await post(extractive, "/v1/completions", {"model": "gpt-4o", "prompt": "hi"})
    assert status == 404


# -- /v1/completions ------------------------------------------------------------------------


async def test_a_completion_asks_the_prompt_as_one_user_message(generating: Client) -> None:
    status, body = await post(
        generating, "/v1/completions", {"model": "direct", "prompt": ["Hello there"]}
    )
    assert status == 200, body
    assert body["object"] == "text_completion"
    [choice] = body["choices"]
    assert choice == {
        "text": "echo: Hello there",
        "index": 0,
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert body["usage"]["total_tokens"] == (
        body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )
    assert body["querygate"]["route"] == "direct"


async def test_a_streamed_completion_is_text_completion_chunks_then_done(
    generating: Client,
) -> None:
    body = {
        "model": "direct",
        "prompt": "Hello streaming world",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with generating.post("/v1/completions", headers=auth(), json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.text()
    datas = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == "echo: Hello streaming world"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finals] == ["stop"]
    assert finals[0]["querygate"]["route"] == "direct"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"echo": True}, "echo: "),
        ({"best_of": 3}, "best_of: "),
        ({"n": 2}, "n: "),
        ({"logprobs": 2}, "logprobs: "),
        ({"suffix": "end"}, "suffix: "),
        ({"max_completion_tokens": 5}, "max_completion_tokens: not a parameter"),
    ],
)
async def test_completion_parameters_it_cannot_honour_are_refused_by_name(
    generating: Client, params: dict[str, Any], named: str
) -> None:
    status, body = await post(
        generating, "/v1/completions", {"model": "direct", "prompt": "hi", **params}
    )
    assert status == 400, body
    assert body["error"]["message"].startswith(named)


@pytest.mark.parametrize("prompt", [["one", "two"], [], "   ", [[1, 2, 3]], None], ids=str)
async def test_a_prompt_that_is_not_one_text_is_a_422(generating: Client, prompt: Any) -> None:
    status, body = await post(generating, "/v1/completions", {"model": "direct", "prompt": prompt})
    assert status == 422, body
    assert body["error"]["message"].startswith("prompt")


# -- without a model: honoured or refused by name --------------------------------------------


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"stop": ["\n"]}, "stop"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": -1.0}, "presence_penalty"),
        ({"stop": "END", "presence_penalty": 1.0}, "stop, presence_penalty"),
    ],
)
@pytest.mark.parametrize("model", ["auto", "lookup", "direct"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_without_a_model_what_a_quote_cannot_honour_is_refused_by_name(
    extractive: Client, params: dict[str, Any], named: str, model: str, path: str
) -> None:
    text = "What does the Acme warranty exclude?"
    body = chat_body(model, text) if "chat" in path else {"model": model, "prompt": text}
    status, answer = await post(extractive, path, {**body, **params})
    assert status == 400, answer
    message = answer["error"]["message"]
    assert message.startswith(f"{named}: no model is configured for the "), message


async def test_without_a_model_sampling_parameters_are_met_as_they_stand(
    extractive: Client,
) -> None:
    """Nothing is sampled: the quote is what temperature 0 asks, the same for the same seed."""
    text = "What does the Acme warranty exclude?"
    plain = chat_body("lookup", text)
    sampled = {**plain, "temperature": 0.7, "top_p": 0.9, "seed": 7, "frequency_penalty": 0}
    status, want = await post(extractive, "/v1/chat/completions", plain)
    assert status == 200, want
    for _ in range(2):
        status, got = await post(extractive, "/v1/chat/completions", sampled)
        assert status == 200, got
        assert got["querygate"]["extractive"] is True
        assert got["choices"][0]["message"] == want["choices"][0]["message"]


# -- /v1/embeddings --------------------------------------------------------------------------


async def test_embeddings_are_the_gateways_own_vectors_in_openais_shape(
    extractive: Client, served_embedder: Embedder
) -> None:
    texts = ["What does the Acme warranty exclude?", "ERR-4471"]
    status, body = await post(
        extractive, "/v1/embeddings", {"model": served_embedder.model_id, "input": texts}
    )
    assert status == 200, body
    assert (body["object"], body["model"]) == ("list", served_embedder.model_id)
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert {d["object"] for d in body["data"]} == {"embedding"}
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = await served_embedder.embed(texts)
    assert got.shape == (2, served_embedder.dimension)
    assert np.allclose(got, want, atol=1e-6)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 2 * 2  # [CLS], [SEP] each, and text
    assert body["querygate"] == {"dimension": served_embedder.dimension, "usage_estimated": False}


async def test_base64_embeddings_are_the_float32_bytes_of_the_float_ones(
    extractive: Client, served_embedder: Embedder
) -> None:
    model = served_embedder.model_id
    one = {"model": model, "input": "warranty exclusions"}
    status, floats = await post(extractive, "/v1/embeddings", one)
    assert status == 200, floats
    status, packed = await post(extractive, "/v1/embeddings", {**one, "encoding_format": "base64"})
    assert status == 200, packed
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(vector, np.array(floats["data"][0]["embedding"], dtype=np.float32))


@pytest.mark.parametrize(
    ("body", "status", "starts"),
    [
        ({"input": ""}, 422, "input"),
        ({"input": ["ok", "\u200b "]}, 422, "input"),
        ({"input": []}, 422, "input"),
        ({"input": [[101, 2023]]}, 422, "input"),
        ({"input": ["x"] * 257}, 422, "input"),
        ({"input": "hi", "encoding_format": "int8"}, 422, "encoding_format"),
        ({"input": "hi", "dimensions": 256}, 400, "dimensions: all-MiniLM-L6-v2 embeds in 384"),
        ({"input": "hi", "truncate": "END"}, 400, "truncate: not a parameter"),
        ({"input": ["fine", "word " * 300]}, 400, "input[1]: 300 tokens, over the 254"),
    ],
    ids=[
        "empty",
        "blank-once-cleaned",
        "no-input",
        "token-arrays",
        "too-many",
        "int8",
        "dimensions",
        "unknown-parameter",
        "over-the-window",
    ],
)
async def test_bad_embedding_requests_are_4xx_naming_the_field(
    extractive: Client, served_embedder: Embedder, body: dict[str, Any], status: int, starts: str
) -> None:
    got, answer = await post(
        extractive, "/v1/embeddings", {"model": served_embedder.model_id, **body}
    )
    assert got == status, answer
    assert answer["error"]["message"].startswith(starts), answer


async def test_embeddings_of_another_model_are_404_naming_this_one(extractive: Client) -> None:
    status, body = await post(
        extractive, "/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}
    )
    assert status == 404
    assert "this gateway embeds with 'all-MiniLM-L6-v2'" in body["error"]["message"]


async def test_embeddings_need_a_tenant_key_and_take_its_rate_limit(
    extractive: Client, served_embedder: Embedder
) -> None:
    body = {"model": served_embedder.model_id, "input": "hi"}
    async with extractive.post("/v1/embeddings", json=body) as resp:
        assert resp.status == 401
    assert (await post(extractive, "/v1/embeddings", body, key="key-rated"))[0] == 200
    status, refused = await post(extractive, "/v1/embeddings", body, key="key-rated")
    assert status == 429
    assert refused["error"]["type"] == "rate_limit_exceeded"


# -- unknown paths and methods ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/nope", "/", "/v1/chat"])
async def test_an_unknown_path_is_a_json_404_naming_the_endpoints(
    extractive: Client, path: str
) -> None:
    async with extractive.post(path, headers=auth(), json={}) as resp:
        assert resp.status == 404
        body = await resp.json()
    message = body["error"]["message"]
    assert body["error"]["type"] == "not_found"
    assert message.startswith(f"no endpoint at {path}")
    for served in ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings"):
        assert served in message
    if path == "/v1/responses":
        assert "Responses API is not served" in message


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/query", "POST"),
        ("TRACE", "/v1/query", "POST"),
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("POST", "/v1/documents/a.md", "DELETE, PUT"),
    ],
)
async def test_a_method_a_path_does_not_take_is_405_with_allow(
    extractive: Client, method: str, path: str, allow: str
) -> None:
    async with extractive.request(method, path, headers=auth()) as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == allow
        body = await resp.json()
    assert body["error"]["type"] == "method_not_allowed"
    assert body["error"]["message"] == f"{method} is not allowed on {path}; allowed: {allow}"


async def test_a_document_id_with_a_line_break_is_refused_by_its_rules_not_by_the_route(
    extractive: Client,
) -> None:
    async with extractive.put("/v1/documents/a%0Ab", headers=auth(), json={"text": "t"}) as resp:
        assert resp.status == 422
        body = await resp.json()
    assert body["error"]["message"] == "doc_id: no control, format or unassigned characters"


async def test_integers_are_taken_as_json_writes_them(generating: Client) -> None:
    """JSON has one number type: `5.0` is 5 (JSON Schema's `integer` says so); a bool is not."""
    body = chat_body("direct", "Hello", max_tokens=5.0, seed=3.0, n=1.0)
    status, answer = await post(generating, "/v1/chat/completions", body)
    assert status == 200, answer
    status, answer = await post(generating, "/v1/chat/completions", {**body, "n": True})
    assert status == 400 and answer["error"]["message"].startswith("n: "), answer
    status, answer = await post(generating, "/v1/chat/completions", {**body, "max_tokens": 5.5})
    assert status == 422 and answer["error"]["message"].startswith("max_tokens"), answer


async def test_tool_choice_without_a_tool_is_refused_naming_it(generating: Client) -> None:
    body = chat_body("direct", "Hello", tools=[], tool_choice="required")
    status, answer = await post(generating, "/v1/chat/completions", body)
    assert (status, answer["error"]["message"]) == (400, "tool_choice: needs tools")
