"""Nothing a client sends produces a 500: each mistake in a body, a field or a header gets its
own clear 4xx JSON error. The app in process, its model a `FakeLLM`; what needs the server's own
HTTP parser, a raw socket or the process's log is in tests/e2e/test_bad_input_wire.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def client(app_client: OpenClient) -> Client:
    return await app_client(llm=FakeLLM())


@dataclass(frozen=True)
class Reply:
    status_code: int
    headers: Mapping[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


async def send(
    client: Client,
    method: str,
    path: str,
    data: bytes | str = b"",
    headers: Mapping[str, str] | None = None,
) -> Reply:
    async with client.request(method, path, data=data, headers=dict(headers or {})) as resp:
        return Reply(resp.status, dict(resp.headers), await resp.text())


async def post(
    client: Client, path: str, data: bytes | str, headers: dict[str, str] | None = None
) -> Reply:
    hdrs = {"Content-Type": "application/json", **auth(), **(headers or {})}
    return await send(client, "POST", path, data, hdrs)


def assert_error(resp: Reply, status: int, kind: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == kind
    assert error["message"]


@pytest.mark.parametrize("path", ["/v1/query", "/v1/chat/completions", "/v1/route"])
async def test_malformed_json_is_400(client: Client, path: str) -> None:
    assert_error(await post(client, path, b'{"query": '), 400, "bad_request")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"just a string"', b"null"])
async def test_a_body_that_is_not_an_object_is_400(client: Client, body: bytes) -> None:
    assert_error(await post(client, "/v1/query", body), 400, "bad_request")


async def test_invalid_utf8_is_400(client: Client) -> None:
    assert_error(await post(client, "/v1/query", b'{"query": "\xff\xfe"}'), 400, "bad_request")


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
async def test_invalid_fields_are_422_naming_the_field(
    client: Client, body: str, field: str
) -> None:
    resp = await post(client, "/v1/query", body)
    assert_error(resp, 422, "validation_error")
    assert field in resp.json()["error"]["message"]


async def test_a_query_over_the_length_limit_is_422(client: Client) -> None:
    resp = await post(client, "/v1/query", '{"query": "' + "a" * 9000 + '"}')
    assert_error(resp, 422, "validation_error")


async def test_an_oversize_body_is_413(client: Client) -> None:
    resp = await post(client, "/v1/query", '{"query": "' + "a" * 70_000 + '"}')
    assert_error(resp, 413, "payload_too_large")


@pytest.mark.parametrize(
    "authorization", [None, "", "Bearer", "Bearer wrong-key", "Basic a2V5", "key-acme-0001"]
)
async def test_missing_or_unknown_key_is_401(client: Client, authorization: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    resp = await send(client, "POST", "/v1/query", '{"query": "q"}', headers)
    assert_error(resp, 401, "unauthorized")


async def test_forcing_a_route_without_permission_is_403(client: Client) -> None:
    body = '{"query": "q", "route": "direct"}'
    resp = await post(client, "/v1/query", body, auth("globex"))
    assert_error(resp, 403, "forbidden")


async def test_unknown_chat_model_is_404(client: Client) -> None:
    body = '{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}'
    assert_error(await post(client, "/v1/chat/completions", body), 404, "not_found")


async def test_chat_must_end_with_a_user_message(client: Client) -> None:
    body = '{"model": "auto", "messages": [{"role": "assistant", "content": "hi"}]}'
    assert_error(await post(client, "/v1/chat/completions", body), 422, "validation_error")


async def test_unknown_path_and_wrong_method_are_json(client: Client) -> None:
    assert_error(await send(client, "GET", "/v1/nothing"), 404, "not_found")
    assert_error(await send(client, "GET", "/v1/query"), 405, "method_not_allowed")


# Text is normalised at the edge; bodies JSON cannot hold are a 4xx naming the problem.


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/query", r'{"query": "\ud800"}', "query"),
        ("/v1/route", r'{"query": "why \udfff?"}', "query"),
        (
            "/v1/query",
            r'{"query": "and then?", "history": [{"role": "user", "content": "\ud800"}]}',
            "history.0.content",
        ),
        (
            "/v1/chat/completions",
            r'{"model": "auto", "messages": [{"role": "user", "content": "\ud800"}]}',
            "messages.0.content",
        ),
    ],
)
async def test_a_lone_surrogate_is_422_naming_the_field(
    client: Client, path: str, body: str, field: str
) -> None:
    resp = await post(client, path, body)
    assert_error(resp, 422, "validation_error")
    assert resp.json()["error"]["message"].startswith(f"{field}: ")
    assert "surrogate" in resp.json()["error"]["message"]


async def test_a_lone_surrogate_in_a_document_is_422(client: Client) -> None:
    hdrs = {"Content-Type": "application/json", **auth()}
    data = r'{"title": "T", "text": "bad \ud800 text"}'
    resp = await send(client, "PUT", "/v1/documents/surrogate-doc", data, hdrs)
    assert_error(resp, 422, "validation_error")
    assert "text" in resp.json()["error"]["message"]


async def test_control_characters_are_removed_and_the_question_answered(
    client: Client,
) -> None:
    resp = await post(client, "/v1/route", r'{"query": "What is ERR\u0000-4471\u001b?\r\n"}')
    assert resp.status_code == 200, resp.text
    resp = await post(client, "/v1/query", r'{"query": "\u0000\u0001\u007f"}')
    assert_error(resp, 422, "validation_error")  # nothing left once cleaned


# Only format characters (Cf), combining marks with no base and white space: nothing to read.
INVISIBLE = [
    r"\u200b",  # zero-width space
    r"\u200f\u0301",  # right-to-left mark, combining acute accent (no base)
    r"\u200d\u200c \u2060",  # zero-width joiner, non-joiner, space, word joiner
    r"\ufeff",  # byte order mark
    r"\u00ad\u20dd\u3164",  # soft hyphen, enclosing circle (Me), Hangul filler
]


@pytest.mark.parametrize("text", INVISIBLE)
@pytest.mark.parametrize(
    ("path", "template", "field"),
    [
        ("/v1/query", '{"query": "%s"}', "query"),
        ("/v1/route", '{"query": "%s"}', "query"),
        (
            "/v1/chat/completions",
            '{"model": "auto", "messages": [{"role": "user", "content": "%s"}]}',
            "messages",
        ),
        ("/v1/documents/invisible-doc", '{"title": "T", "text": "%s"}', "text"),
    ],
    ids=["query", "route", "chat", "document"],
)
async def test_invisible_characters_alone_are_blank(
    client: Client, path: str, template: str, field: str, text: str
) -> None:
    hdrs = {"Content-Type": "application/json", **auth()}
    method = "PUT" if path.startswith("/v1/documents/") else "POST"
    resp = await send(client, method, path, template % text, hdrs)
    assert_error(resp, 422, "validation_error")
    assert resp.json()["error"]["message"].startswith(f"{field}")


@pytest.mark.parametrize(
    "query",
    [r"caf\u0065\u0301?", r"\u200bERR-4471\u200d", r"\u0301a", r"\ue000"],
    ids=["mark-on-a-base", "zero-width-around-a-word", "leading-mark", "private-use"],
)
async def test_a_question_with_a_visible_character_is_answered(client: Client, query: str) -> None:
    resp = await post(client, "/v1/route", f'{{"query": "{query}"}}')
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 30_000,  # under the suite's 64 KiB body limit, far past the nesting one
        b'{"query": "q", "x": ' + b'{"a":' * 6000 + b"1" + b"}" * 6000 + b"}",
        b'{"query": "q", "stream": ' + b"9" * 5000 + b"}",
        b'{"query": "q", "x": NaN}',
        b'{"query": "q", "x": -Infinity}',
        b'{"query": "\xc3\x28"}',
        b"\xef\xbb\xbf{}",  # a UTF-8 BOM is not JSON
    ],
    ids=["nested-array", "nested-object", "5000-digits", "nan", "infinity", "utf8", "bom"],
)
async def test_bodies_json_cannot_hold_are_400(client: Client, body: bytes) -> None:
    for path in ("/v1/query", "/v1/chat/completions", "/v1/route"):
        assert_error(await post(client, path, body), 400, "bad_request")


async def test_a_huge_float_is_a_field_error_not_a_crash(client: Client) -> None:
    resp = await post(client, "/v1/query", '{"query": "q", "stream": 1e999}')
    assert_error(resp, 422, "validation_error")


@pytest.mark.parametrize(
    ("content_type", "body", "status"),
    [
        ("application/x-www-form-urlencoded", "query=hello", 400),
        ("multipart/form-data; boundary=b", "--b\r\n\r\nx\r\n--b--", 400),
        ("text/plain", '{"query": "Acme warranty?"}', 200),  # JSON is read whatever the label
    ],
)  # fmt: skip
async def test_other_content_types(
    client: Client, content_type: str, body: str, status: int
) -> None:
    resp = await post(client, "/v1/route", body, {"Content-Type": content_type})
    assert resp.status_code == status, resp.text


@pytest.mark.parametrize(
    "arguments",
    ["[" * 30_000, '{"a": ' + "9" * 5000 + "}"],
    ids=["nested-too-deeply", "5000-digits"],
)
@pytest.mark.parametrize("where", ["trailing", "history"])
async def test_tool_call_arguments_json_cannot_hold_are_kept_verbatim(
    client: Client, arguments: str, where: str
) -> None:
    """An assistant tool call's `arguments` is a string the client echoes back; a parse of it
    that overflows (RecursionError) or meets a 5000-digit integer (ValueError) is no 500."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    if where == "history":
        messages.append({"role": "user", "content": "and then?"})
    body = json.dumps({"model": "direct", "messages": messages})
    resp = await post(client, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]
