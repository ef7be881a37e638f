"""Nothing a client sends produces a 500: each mistake gets its own clear 4xx JSON error."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

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


def test_a_body_declared_over_the_limit_is_413_before_it_is_sent(gateway: GatewayProcess) -> None:
    """Declared 1 GB, then stalled: it waited out body_read_timeout_s for a 408 (10 s)."""
    host, port = gateway.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: {gateway.headers()['Authorization']}"
        '\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{"query": '
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        reply = sock.recv(65536)
    assert reply.split(b" ", 2)[1] == b"413", reply[:200]  # was the body timeout's 408
    assert b'"payload_too_large"' in reply


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


# Hardening (issue 8): text normalised at the edge, bodies and headers that used to get 500.


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
def test_a_lone_surrogate_is_422_naming_the_field(
    gateway: GatewayProcess, path: str, body: str, field: str
) -> None:
    resp = post(gateway, path, body)
    assert_error(resp, 422, "validation_error")
    assert resp.json()["error"]["message"].startswith(f"{field}: ")
    assert "surrogate" in resp.json()["error"]["message"]


def test_a_lone_surrogate_in_a_document_is_422(gateway: GatewayProcess) -> None:
    hdrs = {"Content-Type": "application/json", **gateway.headers()}
    resp = requests.put(
        f"{gateway.url}/v1/documents/surrogate-doc",
        data=r'{"title": "T", "text": "bad \ud800 text"}',
        headers=hdrs,
        timeout=30,
    )
    assert_error(resp, 422, "validation_error")
    assert "text" in resp.json()["error"]["message"]


def test_control_characters_are_removed_and_the_question_answered(
    gateway: GatewayProcess,
) -> None:
    resp = post(gateway, "/v1/route", r'{"query": "What is ERR\u0000-4471\u001b?\r\n"}')
    assert resp.status_code == 200, resp.text
    resp = post(gateway, "/v1/query", r'{"query": "\u0000\u0001\u007f"}')
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
def test_invisible_characters_alone_are_blank(
    gateway: GatewayProcess, path: str, template: str, field: str, text: str
) -> None:
    hdrs = {"Content-Type": "application/json", **gateway.headers()}
    method = "PUT" if path.startswith("/v1/documents/") else "POST"
    body = template % text
    resp = requests.request(method, f"{gateway.url}{path}", data=body, headers=hdrs, timeout=30)
    assert_error(resp, 422, "validation_error")
    assert resp.json()["error"]["message"].startswith(f"{field}")


@pytest.mark.parametrize(
    "query",
    [r"caf\u0065\u0301?", r"\u200bERR-4471\u200d", r"\u0301a", r"\ue000"],
    ids=["mark-on-a-base", "zero-width-around-a-word", "leading-mark", "private-use"],
)
def test_a_question_with_a_visible_character_is_answered(
    gateway: GatewayProcess, query: str
) -> None:
    resp = post(gateway, "/v1/route", f'{{"query": "{query}"}}')
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 30_000,  # under the e2e gateway's 64 KiB body limit, far past the nesting one
        b'{"query": "q", "x": ' + b'{"a":' * 6000 + b"1" + b"}" * 6000 + b"}",
        b'{"query": "q", "stream": ' + b"9" * 5000 + b"}",
        b'{"query": "q", "x": NaN}',
        b'{"query": "q", "x": -Infinity}',
        b'{"query": "\xc3\x28"}',
        b"\xef\xbb\xbf{}",  # a UTF-8 BOM is not JSON
    ],
    ids=["nested-array", "nested-object", "5000-digits", "nan", "infinity", "utf8", "bom"],
)
def test_bodies_json_cannot_hold_are_400(gateway: GatewayProcess, body: bytes) -> None:
    for path in ("/v1/query", "/v1/chat/completions", "/v1/route"):
        assert_error(post(gateway, path, body), 400, "bad_request")


def test_a_huge_float_is_a_field_error_not_a_crash(gateway: GatewayProcess) -> None:
    resp = post(gateway, "/v1/query", '{"query": "q", "stream": 1e999}')
    assert_error(resp, 422, "validation_error")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_corrupt_compressed_body_is_400(gateway: GatewayProcess, encoding: str) -> None:
    resp = post(gateway, "/v1/query", b"certainly not compressed", {"Content-Encoding": encoding})
    assert resp.status_code < 500, resp.text
    if encoding == "br":  # brotli is only decoded when the brotli package is installed
        return
    assert resp.status_code == 400, resp.text
    # When the body arrives with the headers, aiohttp's parser refuses it before any handler
    # runs and answers itself, in plain text; otherwise the gateway answers in JSON.
    if resp.headers["Content-Type"].startswith("application/json"):
        assert_error(resp, 400, "bad_request")


@pytest.mark.parametrize("key", [b"Bearer \xff\xfe", b"Bearer key-acme-0001\xc0", b"Bearer \x80"])
def test_a_key_that_is_not_utf8_is_401(gateway: GatewayProcess, key: bytes) -> None:
    headers = {"Content-Type": "application/json", "Authorization": key}
    resp = requests.post(
        f"{gateway.url}/v1/query",
        data='{"query": "q"}',
        headers=headers,  # type: ignore[arg-type]
        timeout=10,
    )
    assert_error(resp, 401, "unauthorized")


@pytest.mark.parametrize(
    ("content_type", "body", "status"),
    [
        ("application/x-www-form-urlencoded", "query=hello", 400),
        ("multipart/form-data; boundary=b", "--b\r\n\r\nx\r\n--b--", 400),
        ("text/plain", '{"query": "Acme warranty?"}', 200),  # JSON is read whatever the label
    ],
)  # fmt: skip
def test_other_content_types(
    gateway: GatewayProcess, content_type: str, body: str, status: int
) -> None:
    resp = post(gateway, "/v1/route", body, {"Content-Type": content_type})
    assert resp.status_code == status, resp.text


def test_healthz_answers_while_adversarial_queries_run(gateway: GatewayProcess) -> None:
    """'a-' * 4000 spent 0.85 s in one regex on the event loop; 8 at once stalled /healthz."""
    body = json.dumps({"query": "a-" * 4000})
    with ThreadPoolExecutor(max_workers=9) as pool:
        queries = [pool.submit(post, gateway, "/v1/route", body) for _ in range(8)]
        health = []
        while not all(q.done() for q in queries):
            start = time.perf_counter()
            resp = requests.get(f"{gateway.url}/healthz", timeout=10)
            health.append(time.perf_counter() - start)
            assert resp.status_code == 200
        statuses = [q.result().status_code for q in queries]
    assert statuses == [200] * 8
    assert max(health) < 1.0, health


@pytest.mark.parametrize(
    "arguments",
    ["[" * 30_000, '{"a": ' + "9" * 5000 + "}"],
    ids=["nested-too-deeply", "5000-digits"],
)
@pytest.mark.parametrize("where", ["trailing", "history"])
def test_tool_call_arguments_json_cannot_hold_are_kept_verbatim(
    gateway: GatewayProcess, arguments: str, where: str
) -> None:
    """An assistant tool call's `arguments` is a string the client echoes back; a parse of it
    that overflowed (RecursionError) or met a 5000-digit integer (ValueError) gave a 500."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    if where == "history":
        messages.append({"role": "user", "content": "and then?"})
    body = json.dumps({"model": "direct", "messages": messages})
    resp = post(gateway, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-H: v\r\n" * 200 + b"\r\n",
        b"POST /v1/route HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["header-too-long", "too-many-headers", "bad-chunk-size"],
)
def test_a_request_the_http_parser_refuses_is_an_info_line_not_an_error(
    gateway: GatewayProcess, request_bytes: bytes
) -> None:
    """aiohttp answers these 400 itself and logged each at ERROR with a traceback: anyone,
    unauthenticated, could page the operator and fill the log ~30x faster than they sent."""
    host, port = gateway.url.removeprefix("http://").split(":")
    seen = len(gateway.log().splitlines())
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request_bytes)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.split(b" ", 2)[1] == b"400", reply[:200]
    lines = [json.loads(line) for line in gateway.log().splitlines()[seen:]]
    server = [line for line in lines if line["logger"] == "aiohttp.server"]
    assert [(line["level"], line["msg"], line["status"]) for line in server] == [
        ("info", "malformed HTTP request refused", 400)
    ]
    assert "exc" not in server[0]


LONG = "z" * 50_000


@pytest.mark.parametrize(
    ("path", "body", "status", "start"),
    [
        (
            "/v1/chat/completions",
            {"model": LONG, "messages": [{"role": "user", "content": "hi"}]},
            404,
            "model 'zzz",
        ),
        (
            "/v1/chat/completions",
            {"model": "auto", "messages": [{"role": "user", "content": "hi"}], LONG: 1},
            400,
            "zzz",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "auto",
                "messages": [{"role": "user", "content": "hi"}],
                **{f"p{i}": 1 for i in range(5000)},
            },
            400,
            "p0: ",
        ),
        ("/v1/query", {"query": "hi", LONG: 1}, 422, "zzz"),
        ("/v1/query", {"query": "hi", "history": [{"role": "x"}] * 2000}, 422, "history.0."),
    ],
    ids=["model-name", "parameter-name", "5000-parameters", "field-name", "2000-bad-items"],
)
def test_an_error_quotes_the_clients_names_briefly(
    gateway: GatewayProcess, path: str, body: dict[str, object], status: int, start: str
) -> None:
    """Quoted whole, a 50 KB name made the response and the request's log line 50 KB (up to
    the 1 MiB body limit by default), and thousands of bad fields were each listed."""
    resp = post(gateway, path, json.dumps(body))
    assert resp.status_code == status, resp.text[:300]
    message = resp.json()["error"]["message"]
    assert start in message, message[:300]
    assert len(message) < 2000, message[:300]
    request_id = resp.headers["X-Request-Id"]
    line = next(line for line in gateway.log().splitlines() if request_id in line)
    assert len(line) < 3000, line[:300]
