"""A number past a float's range (`1e999`) in a JSON object the gateway passes on to the model
(a tool's parameters, a response format's schema) is refused: `load_json` refuses NaN and
Infinity tokens, and such a number parses as infinity, which would reach the upstream as the
non-standard token `Infinity`. The app in process; its model a `FakeLLM` that records what it
is passed."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOL = (
    '"tools":[{"type":"function","function":{"name":"f","parameters":'
    '{"type":"object","properties":{"x":{"type":"number","maximum":%s}}}}}]'
)
SCHEMA = (
    '"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":'
    '{"type":"array","items":[{"type":"number","minimum":%s}]}}}'
)


@pytest.fixture(scope="module")
def llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture(scope="module")
async def client(app_client: OpenClient, llm: FakeLLM) -> Client:
    return await app_client(llm=llm)


async def post(client: Client, key: str, extra: str) -> tuple[int, Any]:
    content = json.dumps(f"Hello {key}")
    raw = f'{{"model":"direct","messages":[{{"role":"user","content":{content}}}],{extra}}}'
    headers = {**auth(), "Content-Type": "application/json"}
    async with client.post("/v1/chat/completions", headers=headers, data=raw) as resp:
        return resp.status, await resp.json()


def calls(llm: FakeLLM, key: str) -> list[Any]:
    return [c for c in llm.calls if any(key in m.content for m in c.messages)]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (TOOL % "1e999", "tools.0.function.parameters"),
        (SCHEMA % "-1e999", "response_format.json_schema"),
    ],
    ids=["tool_parameters", "response_format_schema"],
)
async def test_an_out_of_range_number_passed_on_to_the_model_is_refused_naming_its_field(
    client: Client, llm: FakeLLM, extra: str, field: str
) -> None:
    key = uuid.uuid4().hex
    status, body = await post(client, key, extra)
    assert status == 422, body
    message = body["error"]["message"]
    assert message.startswith(field) and "finite" in message, message
    assert calls(llm, key) == []


async def test_a_large_finite_number_there_is_passed_on(client: Client, llm: FakeLLM) -> None:
    key = uuid.uuid4().hex
    status, body = await post(client, key, TOOL % "1e308")
    assert status == 200, body
    [call] = calls(llm, key)
    tool = call.options.tools[0]
    assert tool["function"]["parameters"]["properties"]["x"]["maximum"] == 1e308
