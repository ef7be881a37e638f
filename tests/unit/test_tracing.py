"""gateway.obs.tracing: when a process traces, what a stage's span records, and that nothing is
recorded (or allocated) outside a request's span.

The SDK's provider is the process's global one, which can be set only once: the recorder below
sets it for the whole test session, to an in-memory exporter. Nothing records without a
request span current, and only these tests open one, so other tests are not traced.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from gateway.obs import tracing
from gateway.obs.logs import JsonFormatter
from gateway.obs.metrics import Metrics
from gateway.obs.timing import StageTimer
from gateway.settings import TracingConfig

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def recorded() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _request(headers: dict[str, str] | None = None) -> tracing.Child:
    return tracing.open_request("POST /v1/query", headers or {}, {"http.route": "/v1/query"})


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


@pytest.mark.parametrize(
    ("enabled", "environ", "expected"),
    [
        (None, {}, False),  # off unless configured
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        (True, {}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        (True, {"OTEL_SDK_DISABLED": "true"}, False),  # the SDK's own switch wins
        (None, {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
    ],
)
def test_a_process_traces_only_when_configured(
    enabled: bool | None, environ: dict[str, str], expected: bool
) -> None:
    assert tracing.wanted(TracingConfig(enabled=enabled), environ) is expected


def test_the_service_is_named_by_the_environment_before_the_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = TracingConfig(service_name="gateway-eu")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert tracing._resource(config).attributes["service.name"] == "gateway-eu"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    resource = tracing._resource(config)
    assert resource.attributes["service.name"] == "from-env"
    assert isinstance(resource.attributes["process.pid"], int)


def test_without_a_request_span_a_stage_is_timed_but_not_traced(
    recorded: InMemorySpanExporter,
) -> None:
    timer = StageTimer(Metrics())
    assert tracing.child("embed") is tracing.UNTRACED  # one shared object: nothing allocated
    with timer.stage("embed"):
        assert not trace.get_current_span().is_recording()
    timer.add("rerank", 0.01)
    assert set(timer.stages_ms) == {"embed", "rerank"}
    assert recorded.get_finished_spans() == ()


def test_stages_are_children_of_the_request_span_which_follows_the_clients(
    recorded: InMemorySpanExporter,
) -> None:
    timer = StageTimer(Metrics())
    client = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with _request({"traceparent": client}) as request:
        with timer.stage("retrieve"):
            timer.add("rerank", 0.25)
        with pytest.raises(TimeoutError), timer.stage("generate"):
            raise TimeoutError
        tracing.end_request(503, "deadline", {"querygate.tenant": "acme"})
    spans = _by_name(recorded.get_finished_spans())
    server = spans["POST /v1/query"]
    assert server.kind is SpanKind.SERVER
    assert server.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert server.parent is not None and server.parent.span_id == 0xB7AD6B7169203331
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes is not None
    assert server.attributes["error.type"] == "deadline"
    assert server.attributes["querygate.tenant"] == "acme"
    assert server.attributes["http.response.status_code"] == 503
    retrieve, rerank, generate = spans["retrieve"], spans["rerank"], spans["generate"]
    assert retrieve.parent is not None and retrieve.parent.span_id == request.context.span_id
    assert rerank.parent is not None and rerank.parent.span_id == retrieve.context.span_id
    assert rerank.end_time is not None and rerank.start_time is not None
    assert (rerank.end_time - rerank.start_time) == pytest.approx(0.25e9, rel=0.01)
    assert retrieve.status.status_code is StatusCode.UNSET
    assert generate.status.status_code is StatusCode.ERROR
    assert generate.attributes is not None and generate.attributes["error.type"] == "TimeoutError"
    assert not trace.get_current_span().is_recording()  # every span's context was restored


def test_a_refused_request_names_its_outcome_without_being_an_error(
    recorded: InMemorySpanExporter,
) -> None:
    with _request():
        tracing.end_request(429, "rate_limited", {})
    (span,) = recorded.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes is not None and span.attributes["error.type"] == "rate_limited"


async def test_a_streamed_calls_span_is_current_only_while_its_items_are_fetched(
    recorded: InMemorySpanExporter,
) -> None:
    seen: list[bool] = []

    async def upstream() -> AsyncIterator[int]:
        for n in range(3):
            seen.append(trace.get_current_span().is_recording())  # as the upstream is asked
            yield n

    with _request() as request:
        span = tracing.detached("llm large", {"querygate.tier": "large"}, SpanKind.CLIENT)
        assert span is not None
        between: list[object] = []
        async for _ in tracing.within(span, upstream()):
            between.append(trace.get_current_span())
    assert seen == [True, True, True]
    assert all(s is request for s in between)  # the consumer never runs under the call's span
    spans = _by_name(recorded.get_finished_spans())
    call = spans["llm large"]
    assert call.parent is not None and call.parent.span_id == request.context.span_id
    assert call.end_time is not None


def test_the_json_log_line_names_the_current_trace_and_span() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test_tracing_log")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("untraced")
        context = SpanContext(0xABC, 0xDEF, False, TraceFlags(1))
        with trace.use_span(NonRecordingSpan(context)):
            logger.warning("traced")
    finally:
        logger.removeHandler(handler)
    untraced, traced = (json.loads(line) for line in stream.getvalue().splitlines())
    assert "trace_id" not in untraced and "span_id" not in untraced
    assert traced["trace_id"] == f"{0xABC:032x}"
    assert traced["span_id"] == f"{0xDEF:016x}"
