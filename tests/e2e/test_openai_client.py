"""The official `openai` client and langchain-openai talk to the gateway unchanged: chat,
completions, embeddings and models, with a model configured and without one."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import openai
import pytest
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
)

from tests.fixtures.gateway import KEYS, GatewayProcess


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEYS["acme"], max_retries=0)


def session() -> str:
    """A conversation no earlier test had, so the cache cannot answer (the key includes it)."""
    return f"session {uuid.uuid4().hex[:8]}"


def test_chat_completion_routes_and_reports_in_an_extra_field(gateway: GatewayProcess) -> None:
    completion = client(gateway).chat.completions.create(
        model="auto",
        messages=[
            {"role": "assistant", "content": session()},
            {"role": "user", "content": "How do I fix ERR-4471?"},
        ],
    )
    assert (completion.choices[0].message.content or "").startswith("FAKE ANSWER")
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    extra = completion.model_extra["querygate"]  # type: ignore[index]
    assert extra["route"] == "lookup"
    assert extra["citations"][0]["doc_id"] == "errors.md"


def test_streamed_chat_completion_with_usage(gateway: GatewayProcess) -> None:
    stream = client(gateway).chat.completions.create(
        model="lookup",
        messages=[
            {"role": "system", "content": f"Be brief. {session()}"},
            {"role": "user", "content": "What does the Acme warranty exclude?"},
        ],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("FAKE ANSWER")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
    assert finals[0].model_extra["querygate"]["route"] == "lookup"  # type: ignore[index]


def test_bad_key_raises_the_clients_authentication_error(gateway: GatewayProcess) -> None:
    bad = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="nope", max_retries=0)
    try:
        bad.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
    except openai.AuthenticationError as exc:
        assert exc.status_code == 401
    else:
        raise AssertionError("expected a 401")


WEATHER_TOOL: ChatCompletionFunctionToolParam = {
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


def scripted(text: str, directive: dict[str, Any]) -> str:
    return f"{text} [[fake:{json.dumps(directive)}]]"


def test_n_of_two_is_the_clients_bad_request_naming_n(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client(gateway).chat.completions.create(
            model="direct", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert raised.value.status_code == 400
    assert "n: " in str(raised.value)


def test_tool_calls_come_back_as_the_clients_own_types(gateway: GatewayProcess) -> None:
    script = {
        "key": session(),
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
    }
    completion = client(gateway).chat.completions.create(
        model="direct",
        messages=[{"role": "user", "content": scripted("Weather in Oslo?", script)}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_streamed_tool_calls_are_joined_by_the_client(gateway: GatewayProcess) -> None:
    script = {
        "key": session(),
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}],
    }
    with client(gateway).chat.completions.stream(
        model="direct",
        messages=[{"role": "user", "content": scripted("Weather in Rome?", script)}],
        tools=[WEATHER_TOOL],
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Rome"}


def langchain_chat(gw: GatewayProcess, model: str, **kw: Any) -> Any:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    return ChatOpenAI(
        base_url=f"{gw.url}/v1",
        api_key=SecretStr(KEYS["acme"]),
        model=model,
        max_retries=0,
        **kw,
    )


def test_langchain_answers_through_the_gateway_with_its_default_parameters(
    gateway: GatewayProcess,
) -> None:
    reply = langchain_chat(gateway, "auto").invoke(f"How do I fix ERR-4471? ({session()})")
    assert reply.content.startswith("FAKE ANSWER")
    assert reply.response_metadata["finish_reason"] == "stop"


def test_langchain_sampling_parameters_are_honoured_not_refused(gateway: GatewayProcess) -> None:
    chat = langchain_chat(gateway, "lookup", temperature=0.2, max_completion_tokens=200, seed=3)
    reply = chat.invoke(f"What does the Acme warranty exclude? ({session()})")
    assert reply.content.startswith("FAKE ANSWER")


def test_langchain_bound_tools_come_back_as_tool_calls(gateway: GatewayProcess) -> None:
    script = {
        "key": session(),
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
    }
    chat = langchain_chat(gateway, "direct").bind_tools([WEATHER_TOOL])
    reply = chat.invoke(scripted("Weather in Oslo?", script))
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", {"city": "Oslo"})]


def test_langchain_with_n_of_two_gets_the_400(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.BadRequestError):
        langchain_chat(gateway, "direct", n=2).invoke("hi")


def test_langchain_tool_loop_round_trips_through_direct(gateway: GatewayProcess) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage

    call = {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_1"}
    script = {"key": session(), "turns": [{"tool_calls": [call]}, {"answer": "Sunny in Oslo."}]}
    chat = langchain_chat(gateway, "direct").bind_tools([WEATHER_TOOL])
    question = HumanMessage(scripted("Weather in Oslo?", script))
    asked = chat.invoke([question])
    assert [c["id"] for c in asked.tool_calls] == ["call_1"]
    result = ToolMessage("sunny, 21 C", tool_call_id="call_1")
    answered = chat.invoke([question, asked, result])
    assert answered.content == "Sunny in Oslo."
    assert not answered.tool_calls


def test_the_openai_client_lists_and_retrieves_the_models(gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["acme"], max_retries=0)
    assert [m.id for m in client.models.list()] == ["auto", "direct", "lookup", "multihop"]
    model = client.models.retrieve("lookup")
    assert (model.id, model.owned_by) == ("lookup", "querygate")


EMBEDDER = "all-MiniLM-L6-v2"


@pytest.mark.parametrize("encoding", [None, "float"], ids=["default-base64", "float"])
def test_the_openai_client_embeds_with_the_gateways_own_model(
    gateway: GatewayProcess, encoding: Any
) -> None:
    """Left to its default, the client asks for base64 and decodes it itself."""
    texts = ["What does the Acme warranty exclude?", "ERR-4471"]
    if encoding is None:
        got = client(gateway).embeddings.create(model=EMBEDDER, input=texts)
    else:
        got = client(gateway).embeddings.create(
            model=EMBEDDER, input=texts, encoding_format=encoding
        )
    assert [d.index for d in got.data] == [0, 1]
    for item in got.data:
        assert len(item.embedding) == 384
        assert math.isclose(math.fsum(x * x for x in item.embedding), 1.0, rel_tol=1e-4)
    assert got.usage.prompt_tokens == got.usage.total_tokens > 4


def test_the_openai_client_gets_the_404_for_another_embedding_model(
    gateway: GatewayProcess,
) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client(gateway).embeddings.create(model="text-embedding-3-small", input="hi")
    assert EMBEDDER in str(raised.value)


def test_the_openai_client_completes_a_prompt(gateway: GatewayProcess) -> None:
    completion = client(gateway).completions.create(
        model="lookup", prompt=f"What does the Acme warranty exclude? ({session()})"
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].text.startswith("FAKE ANSWER")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model_extra["querygate"]["route"] == "lookup"  # type: ignore[index]


def test_the_openai_client_streams_a_completion(gateway: GatewayProcess) -> None:
    stream = client(gateway).completions.create(
        model="lookup", prompt=f"How do I fix ERR-4471? ({session()})", stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices).startswith("FAKE ANSWER")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_the_responses_api_is_a_404_naming_what_is_served(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client(gateway).responses.create(model="auto", input="hi")
    message = str(raised.value)
    assert "Responses API is not served" in message
    assert "POST /v1/chat/completions" in message and "POST /v1/embeddings" in message


def test_without_a_large_model_multihop_is_answered_by_lookup_and_says_so(
    extractive: GatewayProcess,
) -> None:
    listed = client(extractive).models.retrieve("multihop")
    assert listed.model_extra["querygate"]["answered_by"] == "lookup"  # type: ignore[index]
    completion = client(extractive).chat.completions.create(
        model="multihop", messages=[{"role": "user", "content": "Acme warranty exclusions?"}]
    )
    extra = completion.model_extra["querygate"]  # type: ignore[index]
    assert extra["route"] == "lookup" and extra["extractive"] is True
    assert "multihop route is not available in this deployment" in extra["route_reason"]


def test_without_a_model_stop_is_the_clients_bad_request_naming_it(
    extractive: GatewayProcess,
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client(extractive).chat.completions.create(
            model="lookup", messages=[{"role": "user", "content": "Acme warranty?"}], stop=["."]
        )
    assert "stop: no model is configured for the lookup route" in str(raised.value)


def test_langchain_embeds_through_the_gateway(gateway: GatewayProcess) -> None:
    """langchain counts tokens with tiktoken and sends token arrays unless told not to: the
    gateway embeds text (docs/openai.md)."""
    from langchain_openai import OpenAIEmbeddings
    from pydantic import SecretStr

    embeddings = OpenAIEmbeddings(
        model=EMBEDDER,
        base_url=f"{gateway.url}/v1",
        api_key=SecretStr(KEYS["acme"]),
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    vectors = embeddings.embed_documents(["warranty", "ERR-4471"])
    assert [len(v) for v in vectors] == [384, 384]
    assert len(embeddings.embed_query("warranty")) == 384


def test_langchains_completion_model_with_its_defaults(gateway: GatewayProcess) -> None:
    """langchain's `OpenAI` (not `ChatOpenAI`) calls /v1/completions with temperature 0.7,
    max_tokens 256, n 1 and zero penalties: each is honoured."""
    from langchain_openai import OpenAI
    from pydantic import SecretStr

    llm = OpenAI(
        model="auto", base_url=f"{gateway.url}/v1", api_key=SecretStr(KEYS["acme"]), max_retries=0
    )
    assert llm.invoke(f"How do I fix ERR-4471? ({session()})").startswith("FAKE ANSWER")
