"""Nothing a client sends produces a 500: each mistake gets its own clear 4xx JSON error."""

from __future__ import annotations

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess


def post(
    gw: GatewayProcess, path: str, data: bytes | str, headers: dict[str, str] | None = None
) -> requests.Response:
    hdrs = {"Content-Type": "application/json", **gw.headers(), **(headers or {})}
    return requests.post(f"{gw.url}{path}", data=data, headers=hdrs, timeout=30)


def assert_error(resp: requests.Response, status: int, kind: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == kind
    assert error["message"]


@pytest.mark.parametrize("path", ["/v1/query", "/v1/chat/completions", "/v1/route"])
def test_malformed_json_is_400(gateway: GatewayProcess, path: str) -> None:
    assert_error(post(gateway, path, b'{"query": '), 400, "bad_request")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"just a string"', b"null"])
def test_a_body_that_is_not_an_object_is_400(gateway: GatewayProcess, body: bytes) -> None:
    assert_error(post(gateway, "/v1/query", body), 400, "bad_request")


def test_invalid_utf8_is_400(gateway: GatewayProcess) -> None:
    assert_error(post(gateway, "/v1/query", b'{"query": "\xff\xfe"}'), 400, "bad_request")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{}", "query"),
        ('{"query": ""}', "query"),
        ('{"query": "   "}', "query"),
        ('{"query": 42}', "query"),
        ('{"query": ["a"]}', "query"),
        ('{"query": "q", "stream": "yes"}', "stream"),
        ('{"query": "q", "route": "fastest"}', "route"),
        ('{"query": "q", "history": [{"role": "wizard", "content": "x"}]}', "history"),
        ('{"query": "q", "unexpected": 1}', "unexpected"),
    ],
)
def test_invalid_fields_are_422_naming_the_field(
    gateway: GatewayProcess, body: str, field: str
) -> None:
    resp = post(gateway, "/v1/query", body)
    assert_error(resp, 422, "validation_error")
    assert field in resp.json()["error"]["message"]


def test_a_query_over_the_length_limit_is_422(gateway: GatewayProcess) -> None:
    resp = post(gateway, "/v1/query", '{"query": "' + "a" * 9000 + '"}')
    assert_error(resp, 422, "validation_error")


def test_an_oversize_body_is_413(gateway: GatewayProcess) -> None:
    resp = post(gateway, "/v1/query", '{"query": "' + "a" * 70_000 + '"}')
    assert_error(resp, 413, "payload_too_large")


@pytest.mark.parametrize(
    "authorization", [None, "", "Bearer", "Bearer wrong-key", "Basic a2V5", "key-acme-0001"]
)
def test_missing_or_unknown_key_is_401(gateway: GatewayProcess, authorization: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    resp = requests.post(
        f"{gateway.url}/v1/query", data='{"query": "q"}', headers=headers, timeout=10
    )
    assert_error(resp, 401, "unauthorized")


def test_forcing_a_route_without_permission_is_403(gateway: GatewayProcess) -> None:
    resp = post(
        gateway, "/v1/query", '{"query": "q", "route": "direct"}', gateway.headers("globex")
    )
    assert_error(resp, 403, "forbidden")


def test_unknown_chat_model_is_404(gateway: GatewayProcess) -> None:
    body = '{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}'
    assert_error(post(gateway, "/v1/chat/completions", body), 404, "not_found")


def test_chat_must_end_with_a_user_message(gateway: GatewayProcess) -> None:
    body = '{"model": "auto", "messages": [{"role": "assistant", "content": "hi"}]}'
    assert_error(post(gateway, "/v1/chat/completions", body), 422, "validation_error")


def test_unknown_path_and_wrong_method_are_json(gateway: GatewayProcess) -> None:
    assert_error(requests.get(f"{gateway.url}/v1/nothing", timeout=5), 404, "not_found")
    assert_error(requests.get(f"{gateway.url}/v1/query", timeout=5), 405, "method_not_allowed")
