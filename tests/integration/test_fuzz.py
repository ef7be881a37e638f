"""Property-based fuzzing of every endpoint: no client input gets a 5xx or hangs.

The app from `create_app` runs in a thread of its own (its own event loop) with a real embedded
index in tmp, the real MiniLM embedder and the fake upstream for both model tiers; hypothesis
drives it over HTTP with bodies generated from the request models (QueryBody, RouteBody,
ChatBody, the documents body), arbitrary JSON, arbitrary bytes and odd headers. Every response
must be < 500 and arrive within the client timeout; a streamed answer must not end in an
internal error event. Bounded: 550 examples, 10-30 s in all, offline
(no example database).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from backends.embeddings.minilm import MiniLMEmbedder
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import read_paths
from gateway.server.app import create_app
from gateway.settings import Settings, hash_api_key
from tests.fixtures.gateway import DATA

# Hypothesis caches what it learns about the code under .hypothesis/ in the working directory;
# kept in tmp, like everything this test writes.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "querygate-hypothesis")

KEYS = {"acme": "key-fuzz-acme", "globex": "key-fuzz-globex"}
ADMIN_KEY = "key-fuzz-admin"
CLIENT_TIMEOUT_S = 20.0  # past the server's own deadlines: a response later than this is a hang

# The 100k-bracket body makes hypothesis warn that its repr is large; that is the point of it.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FUZZ = settings(
    max_examples=100,
    deadline=None,  # the per-request bound is the client timeout, asserted as a hang
    database=None,  # offline and stateless: nothing written outside tmp
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Gateway:
    url: str
    session: requests.Session


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("fuzz")
    tier = {"api_base": fake_upstream, "retries": 0, "input_cost_per_token": 1e-6}
    config = Settings(
        data_dir=data_dir,
        server={"reload_poll_s": 0, "max_body_bytes": 65536, "request_timeout_s": 10},
        tenants=[
            {"id": "acme", "api_key_sha256": hash_api_key(KEYS["acme"])},
            {
                "id": "globex",
                "api_key_sha256": hash_api_key(KEYS["globex"]),
                "allow_force_route": False,
            },
        ],
        admin_api_key_sha256=hash_api_key(ADMIN_KEY),
        models={
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        router={"rules": [{"name": "billing", "when": {"query_regex": "(?i)invoice|refund"},
                           "then": {"lexical_weight": 3.0}}]},
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=300)

    async def start() -> TestServer:
        embedder = MiniLMEmbedder()
        try:
            async with EmbeddedRetriever(data_dir / "index.sqlite3") as index:
                for tenant in ("acme", "globex"):
                    docs = list(read_paths([DATA / tenant]))
                    await ingest_documents(tenant, docs, embedder, index)
        finally:
            await embedder.aclose()
        server = TestServer(create_app(config), host="127.0.0.1")
        await server.start_server()
        return server

    server = run(start())
    with requests.Session() as session:
        yield Gateway(str(server.make_url("")).rstrip("/"), session)
    run(server.close())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


# Text: any code point, lone surrogates and control characters included.
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=40),
    st.text(st.sampled_from("aA1-_ #?.\n\t\x00é\u0301\ud800"), max_size=300),
    st.sampled_from(["Acme warranty?", "ERR-4471", "a-" * 2000, "where " * 500, "hi", " "]),
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
ANY_JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ROUTE = st.one_of(st.sampled_from(["auto", "direct", "lookup", "multihop"]), ANY_JSON)
ROLE = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), ANY_JSON)
HISTORY_MESSAGE = st.one_of(st.fixed_dictionaries({"role": ROLE, "content": TEXT}), ANY_JSON)
QUERY_BODY = st.fixed_dictionaries(
    {"query": st.one_of(TEXT, ANY_JSON)},
    optional={
        "history": st.one_of(st.lists(HISTORY_MESSAGE, max_size=4), ANY_JSON),
        "route": ROUTE,
        "stream": st.one_of(st.booleans(), ANY_JSON),
        "debug": st.one_of(st.booleans(), ANY_JSON),
        "extra": ANY_JSON,
    },
)
ROUTE_BODY = st.fixed_dictionaries(
    {"query": st.one_of(TEXT, ANY_JSON)}, optional={"route": ROUTE, "extra": ANY_JSON}
)
CONTENT = st.one_of(
    TEXT,
    st.none(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=3),
    ANY_JSON,
)
CHAT_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT}, optional={"name": TEXT}),
    ANY_JSON,
)
CHAT_BODY = st.fixed_dictionaries(
    {
        "model": st.one_of(st.sampled_from(["auto", "direct", "lookup", "multihop"]), ANY_JSON),
        "messages": st.one_of(
            st.lists(CHAT_MESSAGE, min_size=1, max_size=4).map(
                lambda ms: [*ms, {"role": "user", "content": "Acme warranty?"}][-4:]
            ),
            st.lists(CHAT_MESSAGE, max_size=4),
            ANY_JSON,
        ),
    },
    optional={
        "stream": st.one_of(st.booleans(), ANY_JSON),
        "stream_options": st.one_of(st.just({"include_usage": True}), ANY_JSON),
        "temperature": ANY_JSON,
    },
)
DOCUMENT_BODY = st.fixed_dictionaries(
    {"text": st.one_of(TEXT, ANY_JSON)}, optional={"title": st.one_of(TEXT, ANY_JSON)}
)
DOC_ID = st.one_of(
    st.text(ANY_CHAR, min_size=1, max_size=30),
    st.sampled_from(["a/b", "a%2Fb", "%", "%zz", "..", "x" * 600, "warranty.txt"]),
)
# aiohttp's HTTP parser refuses control characters in a header before any of our code runs
# (400, connection closed); every other byte, UTF-8 or not, reaches the gateway.
CONTROL_BYTES = bytes(range(32)) + b"\x7f"
AUTH_HEADER = st.one_of(
    st.sampled_from(
        [f"Bearer {KEYS['acme']}", f"Bearer {KEYS['globex']}", f"Bearer {ADMIN_KEY}", "", "Bearer"]
    ),
    st.binary(max_size=40).map(lambda b: b"Bearer " + b.translate(None, CONTROL_BYTES)),
)
CONTENT_TYPE = st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/json; charset=latin-1", ""]
)  # fmt: skip
CONTENT_ENCODING = st.sampled_from(["", "", "", "gzip", "deflate", "br", "identity", "bogus"])


def encode(body: Any) -> bytes:
    # ensure_ascii: lone surrogates travel as \udXXX escapes, as a client's JSON library sends
    return json.dumps(body, ensure_ascii=True).encode()


RAW_BODY = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [b"[" * 100_000, b'{"query": ' + b"9" * 5000 + b"}", b'{"query": NaN}', b"\xff\xfe{}"]
    ),
    ANY_JSON.map(encode),
)


def call(
    gw: Gateway, method: str, path: str, body: bytes | None, headers: dict[str, Any]
) -> requests.Response | None:
    # A connection of its own: aiohttp closes one after a body it could not read, and a reused
    # connection would fail the next example for it.
    headers = {**headers, "Connection": "close"}
    try:
        resp = gw.session.request(
            method, gw.url + path, data=body, headers=headers, timeout=CLIENT_TIMEOUT_S
        )
    except requests.Timeout:
        pytest.fail(f"no answer within {CLIENT_TIMEOUT_S} s: {method} {path} {body!r:.300}")
    except requests.ConnectionError:
        # A body that cannot be decoded and that no handler read (a 401 answers before the
        # read): aiohttp fails draining it after the response and drops the connection, which
        # the client may see as a reset before the response. Anything else is a failure.
        if headers.get("Content-Encoding") not in (None, "identity"):
            return None
        raise
    assert resp.status_code < 500, f"{method} {path} {body!r:.300} -> {resp.text[:500]}"
    assert "internal_error" not in resp.text, f"{method} {path} {body!r:.300} -> {resp.text}"
    return resp


def auth(tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "Content-Type": "application/json"}


@FUZZ
@given(body=QUERY_BODY, tenant=st.sampled_from(["acme", "globex"]))
def test_query(gateway: Gateway, body: dict[str, Any], tenant: str) -> None:
    call(gateway, "POST", "/v1/query", encode(body), auth(tenant))


@FUZZ
@given(body=CHAT_BODY)
def test_chat_completions(gateway: Gateway, body: dict[str, Any]) -> None:
    call(gateway, "POST", "/v1/chat/completions", encode(body), auth())


@FUZZ
@given(body=ROUTE_BODY)
def test_route(gateway: Gateway, body: dict[str, Any]) -> None:
    call(gateway, "POST", "/v1/route", encode(body), auth())


@settings(FUZZ, max_examples=50)
@given(doc_id=DOC_ID, body=DOCUMENT_BODY, delete=st.booleans())
def test_documents(gateway: Gateway, doc_id: str, body: dict[str, Any], delete: bool) -> None:
    path = "/v1/documents/fuzz-" + quote(doc_id.encode("utf-8", "surrogatepass"), safe="")
    call(gateway, "PUT", path, encode(body), auth("globex"))
    if delete:
        call(gateway, "DELETE", path, None, auth("globex"))


@settings(FUZZ, max_examples=150)
@given(
    method_path=st.sampled_from(
        [
            ("POST", "/v1/query"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/route"),
            ("PUT", "/v1/documents/fuzz-raw"),
            ("DELETE", "/v1/documents/fuzz-missing"),
            ("POST", "/admin/reload"),
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/metrics"),
            ("PATCH", "/v1/query"),
            ("GET", "/v1/nothing"),
        ]
    ),
    body=RAW_BODY,
    authorization=AUTH_HEADER,
    content_type=CONTENT_TYPE,
    content_encoding=CONTENT_ENCODING,
    request_id=st.one_of(st.none(), st.text(max_size=80)),
)
def test_any_bytes_and_headers(
    gateway: Gateway,
    method_path: tuple[str, str],
    body: bytes,
    authorization: str | bytes,
    content_type: str,
    content_encoding: str,
    request_id: str | None,
) -> None:
    headers: dict[str, Any] = {"Authorization": authorization}
    if content_type:
        headers["Content-Type"] = content_type
    if content_encoding:
        headers["Content-Encoding"] = content_encoding
    if request_id is not None:
        raw_id = request_id.encode("utf-8", "surrogatepass")
        headers["X-Request-Id"] = raw_id.translate(None, CONTROL_BYTES).strip()  # as sent
    method, path = method_path
    call(gateway, method, path, body, headers)


def test_the_gateway_still_answers_after_the_fuzzing(gateway: Gateway) -> None:
    resp = call(gateway, "POST", "/v1/query", encode({"query": "Acme warranty?"}), auth())
    assert resp is not None and resp.status_code == 200
    assert resp.json()["answer"]


def test_no_hypothesis_directory_in_the_repository() -> None:
    assert not (Path(__file__).resolve().parents[2] / ".hypothesis").exists()
