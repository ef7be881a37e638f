"""docs/openapi.yaml against the server: the same routes, and real answers fit its schemas.

The answers come from an app in process (`app_client`) whose tiers are the fake upstream over
litellm's real client, configured as the suite's gateway process is."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.server.app import create_app
from gateway.settings import Settings
from tests.fixtures import app
from tests.fixtures.app import OpenClient
from tests.fixtures.gateway import ADMIN_KEY, REPO_ROOT

SPEC: dict[str, Any] = yaml.safe_load((REPO_ROOT / "docs" / "openapi.yaml").read_text())
METHODS = {"get", "put", "post", "delete", "patch"}


def documented_routes() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in SPEC["paths"].items()
        for method in item
        if method in METHODS
    }


def registered_routes(tmp_path: Path) -> set[tuple[str, str]]:
    app = create_app(Settings(data_dir=tmp_path))
    routes = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # aiohttp answers HEAD wherever it answers GET
            continue
        assert route.resource is not None
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.resource.canonical)
        routes.add((route.method, path))
    return routes


def test_openapi_is_3_1_and_its_schemas_are_valid_json_schema() -> None:
    assert SPEC["openapi"].startswith("3.1.")
    for schema in SPEC["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_route_the_app_registers_is_documented_and_no_other(tmp_path: Path) -> None:
    assert registered_routes(tmp_path) == documented_routes()


def schema_for(path: str, method: str, status: int, content_type: str) -> dict[str, Any]:
    responses = SPEC["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} answered {status}, not documented"
    response = responses[str(status)]
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response["content"]
    assert content_type in content, f"{method} {path} {status}: {content_type} not documented"
    schema: dict[str, Any] = content[content_type]["schema"]
    return schema


class Answer:
    """One response, read whole."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        self.status_code, self.content_type, self.body = status, content_type, body

    def json(self) -> Any:
        return json.loads(self.body)


def check(resp: Answer, path: str, method: str) -> None:
    """The answer's status is documented for the operation and its body fits the schema."""
    schema = schema_for(path, method, resp.status_code, resp.content_type)
    if resp.content_type != "application/json":
        return
    # the component schemas travel with it, so "#/components/..." resolves
    jsonschema.Draft202012Validator({**schema, "components": SPEC["components"]}).validate(
        resp.json()
    )


def request_fits(name: str, body: dict[str, Any]) -> bool:
    schema = {"$ref": f"#/components/schemas/{name}", "components": SPEC["components"]}
    return bool(jsonschema.Draft202012Validator(schema).is_valid(body))


class Client:
    def __init__(self, client: app.Client) -> None:
        self.client = client

    async def call(
        self,
        method: str,
        path: str,
        url_path: str | None = None,
        key: str | None = "acme",
        **kw: Any,
    ) -> Answer:
        headers = dict(kw.pop("headers", {}))
        if key == "admin":
            headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        elif key is not None:
            headers.update(app.auth(key))
        async with self.client.request(method, url_path or path, headers=headers, **kw) as resp:
            answer = Answer(resp.status, resp.content_type, await resp.read())
        check(answer, path, method)
        return answer


@pytest.fixture(scope="module")
async def client(app_client: OpenClient, fake_upstream: str) -> Client:
    return Client(await app_client(upstream=fake_upstream))


def fresh() -> list[dict[str, str]]:
    return [{"role": "user", "content": f"openapi {uuid.uuid4().hex[:8]}"}]


@pytest.mark.asyncio(loop_scope="session")
async def test_query_answers_fit_the_document(client: Client) -> None:
    body = {"query": "How do I fix ERR-4471?", "history": fresh(), "debug": True}
    assert request_fits("QueryRequest", body)
    assert (await client.call("POST", "/v1/query", json=body)).status_code == 200
    plain = {"query": "What does the Acme warranty exclude?", "history": fresh()}
    assert (await client.call("POST", "/v1/query", json=plain)).status_code == 200
    assert (await client.call("POST", "/v1/query", json={"query": "hello!"})).status_code == 200
    assert (await client.call("POST", "/v1/query", data=b"{not json")).status_code == 400
    assert (await client.call("POST", "/v1/query", key=None, json=plain)).status_code == 401
    forced = {"query": "hello!", "route": "direct"}
    assert (await client.call("POST", "/v1/query", key="globex", json=forced)).status_code == 403
    assert (await client.call("POST", "/v1/query", json={"query": "  "})).status_code == 422


@pytest.mark.asyncio(loop_scope="session")
async def test_chat_answers_fit_the_document(client: Client) -> None:
    body = {"model": "auto", "messages": [*fresh(), {"role": "user", "content": "Acme warranty?"}]}
    assert request_fits("ChatRequest", body)
    assert (await client.call("POST", "/v1/chat/completions", json=body)).status_code == 200
    script = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    text = f"Weather? [[fake:{json.dumps(script)}]]"
    with_tools = {
        "model": "direct",
        "messages": [{"role": "user", "content": text}],
        "tools": [tool],
        "temperature": 0.2,
        "max_completion_tokens": 100,
    }
    assert request_fits("ChatRequest", with_tools)
    resp = await client.call("POST", "/v1/chat/completions", json=with_tools)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["tool_calls"]
    # what the document refuses, the server refuses
    two = {**body, "n": 2}
    assert not request_fits("ChatRequest", two)
    assert (await client.call("POST", "/v1/chat/completions", json=two)).status_code == 400
    unknown = {**body, "model": "gpt-4o"}
    assert not request_fits("ChatRequest", unknown)
    assert (await client.call("POST", "/v1/chat/completions", json=unknown)).status_code == 404


@pytest.mark.asyncio(loop_scope="session")
async def test_models_and_route_answers_fit_the_document(client: Client) -> None:
    assert (await client.call("GET", "/v1/models")).status_code == 200
    assert (await client.call("GET", "/v1/models", key=None)).status_code == 401
    one = "/v1/models/{model}"
    assert (await client.call("GET", one, "/v1/models/lookup")).status_code == 200
    assert (await client.call("GET", one, "/v1/models/gpt-4o")).status_code == 404
    body = {"query": "Compare the Acme and Globex warranties"}
    assert request_fits("RouteRequest", body)
    assert (await client.call("POST", "/v1/route", json=body)).status_code == 200


@pytest.mark.asyncio(loop_scope="session")
async def test_document_answers_fit_the_document(client: Client) -> None:
    path = "/v1/documents/{doc_id}"
    url = f"/v1/documents/openapi-{uuid.uuid4().hex[:8]}.md"
    body = {"title": "OpenAPI check", "text": "The OpenAPI check document says ERR-9090."}
    assert request_fits("DocumentRequest", body)
    assert (await client.call("PUT", path, url, json=body)).status_code == 201
    assert (await client.call("PUT", path, url, json=body)).status_code == 200
    assert (await client.call("PUT", path, url, json={"text": ""})).status_code == 422
    assert (await client.call("DELETE", path, url)).status_code == 200
    assert (await client.call("DELETE", path, url)).status_code == 404


@pytest.mark.asyncio(loop_scope="session")
async def test_operator_answers_fit_the_document(client: Client) -> None:
    assert (await client.call("GET", "/healthz", key=None)).status_code == 200
    assert (await client.call("GET", "/readyz", key=None)).status_code == 200
    assert (await client.call("GET", "/metrics", key=None)).status_code == 200
    assert (await client.call("POST", "/admin/reload", key="admin")).status_code == 200
    assert (await client.call("POST", "/admin/reload")).status_code == 401
    assert (await client.call("GET", "/admin/config", key="admin")).status_code == 200
    assert (await client.call("GET", "/admin/config")).status_code == 401


@pytest.mark.asyncio(loop_scope="session")
async def test_completion_and_embedding_answers_fit_the_document(client: Client) -> None:
    prompt = {"model": "lookup", "prompt": f"Acme warranty? {uuid.uuid4().hex[:8]}"}
    assert request_fits("CompletionRequest", prompt)
    assert (await client.call("POST", "/v1/completions", json=prompt)).status_code == 200
    echoed = {**prompt, "echo": True}
    assert not request_fits("CompletionRequest", echoed)
    assert (await client.call("POST", "/v1/completions", json=echoed)).status_code == 400
    texts = {"model": "all-MiniLM-L6-v2", "input": ["warranty", "ERR-4471"]}
    assert request_fits("EmbeddingRequest", texts)
    assert (await client.call("POST", "/v1/embeddings", json=texts)).status_code == 200
    packed = {**texts, "encoding_format": "base64"}
    assert (await client.call("POST", "/v1/embeddings", json=packed)).status_code == 200
    blank = {**texts, "input": ["\u200b"]}
    assert not request_fits("EmbeddingRequest", blank)
    assert (await client.call("POST", "/v1/embeddings", json=blank)).status_code == 422
    other = {**texts, "model": "text-embedding-3-small"}
    assert not request_fits("EmbeddingRequest", other)
    assert (await client.call("POST", "/v1/embeddings", json=other)).status_code == 404


@pytest.mark.asyncio(loop_scope="session")
async def test_the_text_rules_the_document_states_are_the_servers(client: Client) -> None:
    blank = {"query": "\u200b \x00"}
    assert not request_fits("QueryRequest", blank)
    assert (await client.call("POST", "/v1/query", json=blank)).status_code == 422
    only_a_tool_result = {"model": "auto", "messages": [{"role": "tool", "content": "x"}]}
    assert not request_fits("ChatRequest", only_a_tool_result)
    assert (
        await client.call("POST", "/v1/chat/completions", json=only_a_tool_result)
    ).status_code == 422
