"""The official `openai` client talks to the gateway unchanged."""

from __future__ import annotations

import uuid

import openai

from tests.fixtures.gateway import KEYS, GatewayProcess


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEYS["acme"], max_retries=0)


def test_chat_completion_routes_and_reports_in_an_extra_field(gateway: GatewayProcess) -> None:
    question = f"How do I fix ERR-4471? ({uuid.uuid4().hex[:6]})"
    completion = client(gateway).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": question}]
    )
    assert completion.choices[0].message.content.startswith("FAKE ANSWER")
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    extra = completion.model_extra["querygate"]  # type: ignore[index]
    assert extra["route"] == "lookup"
    assert extra["citations"][0]["doc_id"] == "errors.md"


def test_streamed_chat_completion_with_usage(gateway: GatewayProcess) -> None:
    question = f"What does the Acme warranty exclude? ({uuid.uuid4().hex[:6]})"
    stream = client(gateway).chat.completions.create(
        model="lookup",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": question},
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
