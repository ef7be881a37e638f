"""Traces read back from a real Jaeger: `querygate serve --workers 2` exports each request's spans
over OTLP/HTTP, a client's W3C `traceparent` is their parent, and the fake upstream receives
the trace context of the model call that asked it.

Each test sends its own trace id (so it reads only its own trace) and its own fake directive key
(so it reads only its own upstream requests).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway
from tests.fixtures.jaeger import Jaeger, tags
from tests.fixtures.upstream import upstream_stats

# Needs a Go tool that scripts/test.sh builds (helm or Jaeger): it runs these once it is built.
pytestmark = pytest.mark.gotools

QUESTION = "How long is the Acme warranty?"
# Every string attribute is cut to this (the `tracing.max_attribute_length` default).
MAX_ATTRIBUTE = 256


@pytest.fixture(scope="module")
def traced(
    jaeger: Jaeger, fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with pytest.MonkeyPatch.context() as env:
        # The batch goes out after 100 ms, not the SDK's 5 s: the tests wait for less.
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        gw = start_gateway(
            tmp_path_factory.mktemp("traced"),
            fake_upstream,
            overrides={"tracing": {"enabled": True, "endpoint": jaeger.otlp_url}},
            serve_args=("--workers", "2"),
        )
    yield gw
    stop_gateway(gw)


def _traceparent() -> tuple[str, str, str]:
    """A client's trace id, its span id, and the header naming them (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _post(
    gw: GatewayProcess, path: str, body: dict[str, Any], traceparent: str
) -> tuple[requests.Response, str]:
    request_id = uuid.uuid4().hex
    headers = {**gw.headers(), "traceparent": traceparent, "X-Request-Id": request_id}
    return requests.post(f"{gw.url}{path}", json=body, headers=headers, timeout=60), request_id


def _directed(question: str, directive: dict[str, Any]) -> tuple[str, str]:
    key = uuid.uuid4().hex
    return key, f"{question} [[fake:{json.dumps(directive | {'key': key})}]]"


def _named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["operationName"] == name]


def _one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = _named(spans, name)
    assert len(found) == 1, (name, [s["operationName"] for s in spans])
    return found[0]


def _parent(span: dict[str, Any]) -> str | None:
    refs = [r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
    return refs[0] if refs else None


def _has(*names: str) -> Any:
    def whole(spans: list[dict[str, Any]]) -> bool:
        got = [s["operationName"] for s in spans]
        return all(n in got for n in names) and any(n.startswith("llm ") for n in got)

    return whole


def _request_line(gw: GatewayProcess, request_id: str) -> dict[str, Any]:
    return next(x for x in gw.request_lines(request_id) if x.get("msg") == "request")


def test_a_lookup_is_one_trace_under_the_clients_span_down_to_the_upstream(
    traced: GatewayProcess, jaeger: Jaeger, fake_upstream: str
) -> None:
    trace_id, client_span, traceparent = _traceparent()
    key, text = _directed(QUESTION, {"usage": {"prompt_tokens": 120, "completion_tokens": 30}})
    response, request_id = _post(
        traced, "/v1/query", {"query": text, "route": "lookup"}, traceparent
    )
    assert response.status_code == 200, response.text
    stages = ("cache_lookup", "embed", "classify", "policy", "retrieve", "generate")
    spans = jaeger.spans(trace_id, _has("POST /v1/query", *stages, "cache_store"))

    server = _one(spans, "POST /v1/query")
    assert _parent(server) == client_span  # the client's span is its parent
    attributes = tags(server)
    assert attributes["span.kind"] == "server"
    assert attributes["http.route"] == "/v1/query"
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.response.status_code"] == 200
    assert attributes["querygate.tenant"] == "acme"
    assert attributes["querygate.route"] == "lookup"
    assert attributes["querygate.cache"] == "miss"
    assert attributes["querygate.request_id"] == request_id
    assert "error.type" not in attributes and "otel.status_code" not in attributes
    for name in (*stages, "cache_store"):
        assert _parent(_one(spans, name)) == server["spanID"], name
    assert tags(_one(spans, "policy"))["querygate.route"] == "lookup"

    (model,) = [s for s in spans if s["operationName"].startswith("llm ")]
    assert _parent(model) == _one(spans, "generate")["spanID"]
    call = tags(model)
    assert call["span.kind"] == "client"
    assert call["querygate.tier"] == model["operationName"].removeprefix("llm ")
    assert call["gen_ai.response.model"] in ("openai/fake-small", "openai/fake-large")
    assert (call["gen_ai.usage.input_tokens"], call["gen_ai.usage.output_tokens"]) == (120, 30)
    assert call["querygate.cost_usd"] == pytest.approx(120 * 1e-6 + 30 * 2e-6)
    # The request's cost on its span is the answer's.
    assert attributes["querygate.cost_usd"] == pytest.approx(response.json()["usage"]["cost_usd"])

    # The upstream was asked under the model call's span, of the same trace.
    sent = asyncio.run(upstream_stats(fake_upstream))["traceparents_by_key"][key]
    assert sent == [f"00-{trace_id}-{model['spanID']}-01"]

    # The request's log line names its trace and its span.
    line = _request_line(traced, request_id)
    assert (line["trace_id"], line["span_id"]) == (trace_id, server["spanID"])

    # Bounded: neither the question (`record_question` is off) nor any long text.
    for span in spans:
        for value in tags(span).values():
            if isinstance(value, str):
                assert QUESTION not in value
                assert len(value) <= MAX_ATTRIBUTE


def test_a_failed_request_and_its_model_call_are_errors_with_their_type(
    traced: GatewayProcess, jaeger: Jaeger, fake_upstream: str
) -> None:
    trace_id, _, traceparent = _traceparent()
    key, text = _directed("Hello", {"status": 500})
    response, request_id = _post(
        traced, "/v1/query", {"query": text, "route": "direct"}, traceparent
    )
    assert response.status_code == 503, response.text
    outcome = _request_line(traced, request_id)["outcome"]
    spans = jaeger.spans(trace_id, _has("POST /v1/query", "generate"))

    server = tags(_one(spans, "POST /v1/query"))
    assert server["http.response.status_code"] == 503
    assert server["otel.status_code"] == "ERROR"
    # Every model failed (its retries spent): the outcome the log line and the client's JSON say.
    assert server["error.type"] == outcome == response.json()["error"]["type"]
    (model,) = [s for s in spans if s["operationName"].startswith("llm ")]
    call = tags(model)
    assert call["otel.status_code"] == "ERROR"
    assert call["error.type"] == "BackendUnavailable"  # the tier's chain, every model failed
    # The stage it failed in failed too; each attempt upstream carried the call's context.
    assert tags(_one(spans, "generate"))["otel.status_code"] == "ERROR"
    sent = asyncio.run(upstream_stats(fake_upstream))["traceparents_by_key"][key]
    assert sent and set(sent) == {f"00-{trace_id}-{model['spanID']}-01"}


def test_each_agent_step_and_tool_call_is_a_span_with_its_model_calls(
    traced: GatewayProcess, jaeger: Jaeger
) -> None:
    trace_id, _, traceparent = _traceparent()
    search = {"name": "search", "arguments": {"query": "Acme warranty"}, "id": "s"}
    script = {"turns": [{"tool_calls": [search]}, {"answer": "Two years {cite:1}."}]}
    _, text = _directed(QUESTION, script)
    response, _ = _post(traced, "/v1/query", {"query": text, "route": "multihop"}, traceparent)
    assert response.status_code == 200, response.text

    def whole(spans: list[dict[str, Any]]) -> bool:
        return len(_named(spans, "agent_step")) == 2 and bool(_named(spans, "agent_tool"))

    spans = jaeger.spans(trace_id, whole)
    agent = _one(spans, "agent")
    steps = sorted(_named(spans, "agent_step"), key=lambda s: tags(s)["querygate.agent.step"])
    assert [tags(s)["querygate.agent.step"] for s in steps] == [1, 2]
    assert all(_parent(s) == agent["spanID"] for s in steps)
    tool = _one(spans, "agent_tool")
    assert _parent(tool) == steps[0]["spanID"]
    assert tags(tool)["querygate.tool"] == "search"
    assert tags(tool)["querygate.tool.status"] == "ok"
    models = [s for s in spans if s["operationName"] == "llm large"]
    assert sorted(_parent(s) or "" for s in models) == sorted(s["spanID"] for s in steps)


def test_each_worker_exports_its_own_requests_spans(traced: GatewayProcess, jaeger: Jaeger) -> None:
    """Requests spread over both workers: every one's trace arrives, from the worker whose log
    line it is (the resource's `process.pid`)."""
    pids: set[int] = set()
    for n in range(40):
        trace_id, _, traceparent = _traceparent()
        response, request_id = _post(
            traced, "/v1/route", {"query": f"Capital of country {n}?"}, traceparent
        )
        assert response.status_code == 200, response.text
        (span,) = jaeger.spans(trace_id, lambda spans: bool(_named(spans, "POST /v1/route")))[:1]
        process = jaeger.processes(trace_id)[span["processID"]]
        pid = _request_line(traced, request_id)["pid"]
        assert process["process.pid"] == pid
        assert process["service.name"] == "querygate"
        pids.add(pid)
        if len(pids) == 2:
            return
    raise AssertionError(f"40 requests all went to worker {pids}")


def test_untraced_gateway_sends_no_trace_context_and_logs_no_trace_id(
    gateway: GatewayProcess, fake_upstream: str
) -> None:
    """Off by default: a client's `traceparent` is neither followed nor passed on."""
    _, _, traceparent = _traceparent()
    key, text = _directed("Hello", {})
    response, request_id = _post(
        gateway, "/v1/query", {"query": text, "route": "direct"}, traceparent
    )
    assert response.status_code == 200, response.text
    assert asyncio.run(upstream_stats(fake_upstream))["traceparents_by_key"][key] == [None]
    assert "trace_id" not in _request_line(gateway, request_id)


def test_spans_still_queued_are_exported_when_the_gateway_stops(
    jaeger: Jaeger, fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # no batch would go out for 10 minutes
        gw = start_gateway(
            tmp_path_factory.mktemp("flushed"),
            fake_upstream,
            overrides={"tracing": {"enabled": True, "endpoint": jaeger.otlp_url}},
        )
    try:
        trace_id, _, traceparent = _traceparent()
        response, _ = _post(gw, "/v1/route", {"query": "Capital of France?"}, traceparent)
        assert response.status_code == 200, response.text
        queued = requests.get(f"{jaeger.query_url}/api/traces/{trace_id}", timeout=10)
        assert queued.status_code == 404  # still in the gateway's queue
    finally:
        stop_gateway(gw)
    assert gw.proc.returncode == 0
    spans = jaeger.spans(trace_id, lambda spans: bool(_named(spans, "POST /v1/route")))
    assert _one(spans, "POST /v1/route")["traceID"] == trace_id
