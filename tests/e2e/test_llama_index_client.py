"""llama-index's OpenAILike talks to the gateway with its defaults: as a completion model (its
default, `is_chat_model=False`: every call, chat too, goes to /v1/completions with a prompt)
and as a chat model, with a model configured and without one (its default temperature, 0.1,
is met as it stands by an extractive answer: nothing is sampled)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.fixtures.gateway import KEYS, GatewayProcess


def llm(gw: GatewayProcess, model: str = "auto", **kw: Any) -> Any:
    from llama_index.llms.openai_like import OpenAILike

    return OpenAILike(
        model=model, api_base=f"{gw.url}/v1", api_key=KEYS["acme"], max_retries=0, **kw
    )


def fresh(text: str) -> str:
    return f"{text} (llama {uuid.uuid4().hex[:8]})"


def test_the_completion_default_completes_through_v1_completions(
    gateway: GatewayProcess,
) -> None:
    reply = llm(gateway, "lookup").complete(fresh("How do I fix ERR-4471?"))
    assert reply.text.startswith("FAKE ANSWER")
    assert reply.raw.object == "text_completion"
    assert reply.raw.model_extra["querygate"]["route"] == "lookup"


def test_the_completion_default_streams(gateway: GatewayProcess) -> None:
    pieces = list(llm(gateway).stream_complete(fresh("What does the Acme warranty exclude?")))
    assert len(pieces) > 1
    assert pieces[-1].text.startswith("FAKE ANSWER")


def test_chat_on_the_completion_default_is_one_prompt(gateway: GatewayProcess) -> None:
    from llama_index.core.llms import ChatMessage

    reply = llm(gateway).chat([ChatMessage(role="user", content=fresh("Acme warranty?"))])
    # llama-index writes the conversation as one prompt ("user: ...\\nassistant:")
    assert (reply.message.content or "").startswith("FAKE ANSWER: user: Acme warranty?")


def test_the_chat_model_goes_to_chat_completions(gateway: GatewayProcess) -> None:
    from llama_index.core.llms import ChatMessage

    chat = llm(gateway, "lookup", is_chat_model=True)
    reply = chat.chat([ChatMessage(role="user", content=fresh("How do I fix ERR-4471?"))])
    assert (reply.message.content or "").startswith("FAKE ANSWER")
    assert reply.raw.object == "chat.completion"
    assert reply.raw.model_extra["querygate"]["citations"][0]["doc_id"] == "errors.md"


def test_without_a_model_both_defaults_answer_from_the_documents(
    extractive: GatewayProcess,
) -> None:
    from llama_index.core.llms import ChatMessage

    completed = llm(extractive).complete("How do I fix ERR-4471?")
    extra = completed.raw.model_extra["querygate"]
    assert extra["extractive"] is True
    assert extra["citations"][0]["doc_id"] == "errors.md"
    # the evidence's sentences quoted verbatim, cited
    assert "TLS certificate expired" in completed.text
    assert completed.text.rstrip().endswith("[1]")
    chat = llm(extractive, is_chat_model=True)
    reply = chat.chat([ChatMessage(role="user", content="How do I fix ERR-4471?")])
    assert reply.raw.model_extra["querygate"]["extractive"] is True
    assert (reply.message.content or "") == completed.text
