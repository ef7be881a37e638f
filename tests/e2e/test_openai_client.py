"""The official `openai` client talks to the gateway unchanged."""

from __future__ import annotations

import uuid

import openai

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
    assert completion.choices[0].message.content.startswith("FAKE ANSWER")
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
