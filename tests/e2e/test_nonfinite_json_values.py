"""A number past a float's range (`1e999`) in a JSON object the gateway passes on to the model
(a tool's parameters, a response format's schema) is refused: `load_json` refuses NaN and
Infinity tokens, but such a number parses as infinity and reached the upstream as the
non-standard token `Infinity`."""

from __future__ import annotations

import json
import random
import string

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess


def _key() -> str:
    return "finite" + "".join(random.choice(string.ascii_lowercase) for _ in range(12))


def _calls(upstream: str, key: str) -> int:
    resp = requests.get(f"{upstream.removesuffix('/v1')}/admin/stats", timeout=5)
    assert resp.status_code == 200
    return int(resp.json()["by_key"].get(key, 0))


def _post(gw: GatewayProcess, raw: str) -> requests.Response:
    headers = {**gw.headers(), "Content-Type": "application/json"}
    return requests.post(f"{gw.url}/v1/chat/completions", headers=headers, data=raw, timeout=30)


def _body(key: str, extra: str) -> str:
    content = json.dumps(f"Hello [[fake:{json.dumps({'key': key})}]]")
    return f'{{"model":"direct","messages":[{{"role":"user","content":{content}}}],{extra}}}'


TOOL = (
    '"tools":[{"type":"function","function":{"name":"f","parameters":'
    '{"type":"object","properties":{"x":{"type":"number","maximum":%s}}}}}]'
)
SCHEMA = (
    '"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":'
    '{"type":"array","items":[{"type":"number","minimum":%s}]}}}'
)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (TOOL % "1e999", "tools.0.function.parameters"),
        (SCHEMA % "-1e999", "response_format.json_schema"),
    ],
    ids=["tool_parameters", "response_format_schema"],
)
def test_an_out_of_range_number_passed_on_to_the_model_is_refused_naming_its_field(
    gateway: GatewayProcess, fake_upstream: str, extra: str, field: str
) -> None:
    key = _key()
    resp = _post(gateway, _body(key, extra))
    assert resp.status_code == 422, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith(field) and "finite" in message, message
    assert _calls(fake_upstream, key) == 0


def test_a_large_finite_number_there_is_passed_on(
    gateway: GatewayProcess, fake_upstream: str
) -> None:
    key = _key()
    resp = _post(gateway, _body(key, TOOL % "1e308"))
    assert resp.status_code == 200, resp.text
    assert _calls(fake_upstream, key) == 1
