"""OpenTelemetry traces: one server span per request, a child per pipeline stage and model call,
exported over OTLP/HTTP when configured (docs/tracing.md).

Off (the default), nothing is installed: the OpenTelemetry API's global provider stays its
no-op, no request span is started, and every helper here returns after one look at the
current span (a context variable), so a request costs no span object. On, `install` sets the
SDK's provider up in the process that serves: each worker of `serve --workers N` is its own
process with its own batch exporter thread (the supervisor serves nothing and exports
nothing), and `Tracing.shutdown` flushes what is queued when it stops.

Spans carry bounded attributes only: names of closed sets (tenant, route, tier, stage), counts
and costs; never a document's text, and the question only with `tracing.record_question`.
Every string attribute is cut by the SDK's span limits (`tracing.max_attribute_length`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from gateway.settings import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

# A proxy until `install` sets the provider: every span querygate makes is this tracer's
# (routers get `child` passed down; backends only read the current span, to send it upstream).
_tracer = trace.get_tracer("querygate")
# The environment variables by which the SDK itself is told where to export.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

Attributes = Mapping[str, AttributeValue]
T = TypeVar("T")


def wanted(config: TracingConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process traces: never with the SDK's `OTEL_SDK_DISABLED=true`; else as
    `tracing.enabled` says; unset, when the environment names an OTLP endpoint."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if config.enabled is not None:
        return config.enabled
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


@dataclass(frozen=True, slots=True)
class Tracing:
    """The process's installed provider."""

    provider: TracerProvider

    def shutdown(self) -> None:
        """Export what is queued, then stop the exporter's thread."""
        self.provider.shutdown()


def install(config: TracingConfig) -> Tracing | None:
    """The SDK's provider as this process's global one, or None when tracing is off. The
    sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the exporter's headers,
    timeout and compression come from the SDK's own environment variables."""
    if not wanted(config):
        return None
    # Imported only here: the SDK and the exporter (protobuf, requests) take a quarter of a
    # second to import, which a process that does not trace never pays.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    limits = SpanLimits(max_span_attribute_length=config.max_attribute_length)
    provider = TracerProvider(resource=_resource(config), span_limits=limits)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint)))
    trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"endpoint": config.endpoint or "from the environment"})
    return Tracing(provider)


def _resource(config: TracingConfig) -> Resource:
    """The SDK's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win), named after
    `tracing.service_name` when the environment names no service, with this process's id:
    which worker of `serve --workers N` a span came from, as its log lines' `pid` says."""
    from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_NAME, Resource

    detected = Resource.create().merge(Resource({PROCESS_PID: os.getpid()}))
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: config.service_name}))
    return detected


def recording() -> bool:
    """A request span records in this context (tracing is on and the request is sampled)."""
    return trace.get_current_span().is_recording()


class Child:
    """A span opened as the current one, as a context manager: leaving it ends the span (an
    exception marks it failed) and restores its parent."""

    __slots__ = ("_judges", "_token", "span")

    def __init__(
        self, span: Span, parent: context.Context | None = None, judges: bool = True
    ) -> None:
        """`judges`: an exception out of the block marks the span failed (a request's span is
        judged by its outcome instead, `end_request`)."""
        self.span = span
        self._token = context.attach(trace.set_span_in_context(span, parent))
        self._judges = judges

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, kind: object, failure: BaseException | None, tb: object) -> None:
        if self._judges and failure is not None and not isinstance(failure, GeneratorExit):
            failed(self.span, failure)  # a stream its consumer stopped did not fail
        # Only while it is still the current span: a stream closed later from another
        # context (its consumer gone) must not pull that context's span out from under it.
        if trace.get_current_span() is self.span:
            context.detach(self._token)
        self.span.end()


class _Untraced:
    """What `child` gives when nothing records: one shared object, nothing to allocate."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, failure: BaseException | None, tb: object) -> None:
        return None


UNTRACED = _Untraced()


def child(
    name: str, attributes: Attributes | None = None, kind: SpanKind = SpanKind.INTERNAL
) -> Child | _Untraced:
    """A child of the current span, made current for a `with` block, when that one records."""
    if not trace.get_current_span().is_recording():
        return UNTRACED
    return Child(_tracer.start_span(name, kind=kind, attributes=attributes))


def detached(
    name: str, attributes: Attributes | None = None, kind: SpanKind = SpanKind.INTERNAL
) -> Span | None:
    """A child of the current span that is not made current (`within` makes it current
    around each step of a stream), when the current one records."""
    if not trace.get_current_span().is_recording():
        return None
    return _tracer.start_span(name, kind=kind, attributes=attributes)


async def within(span: Span, stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """`stream` with `span` current while each of its items is fetched, never while the
    consumer holds one (an async generator shares its consumer's context: a span current
    across its `yield` would parent whatever the consumer does meanwhile). `span` ends with
    the stream, failed if it failed."""
    items = aiter(stream)
    try:
        while True:
            token = context.attach(trace.set_span_in_context(span))
            try:
                item = await anext(items)
            except StopAsyncIteration:
                return
            except BaseException as exc:
                failed(span, exc)
                raise
            finally:
                context.detach(token)
            yield item
    finally:
        span.end()


def record_past(name: str, seconds: float) -> None:
    """A child span of the current one for work that ended just now and took `seconds`
    (timed elsewhere, such as a rerank inside a retrieval)."""
    if not trace.get_current_span().is_recording():
        return
    end = time.time_ns()
    _tracer.start_span(name, start_time=end - int(seconds * 1e9)).end(end_time=end)


def annotate(attributes: Attributes) -> None:
    """Attributes on the current span, when it records."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def failed(span: Span, failure: BaseException) -> None:
    """Status ERROR, with the failure's type; its message is not kept (it may quote an
    upstream's or a client's text)."""
    kind = type(failure).__name__
    span.set_status(Status(StatusCode.ERROR, kind))
    span.set_attribute("error.type", kind)


def open_request(name: str, headers: Mapping[str, str], attributes: Attributes) -> Child:
    """The request's server span, made current: a child of the client's W3C `traceparent`
    (and `tracestate`) when it sent one, else the root of a new trace."""
    parent = propagate.extract(headers)
    span = _tracer.start_span(name, parent, SpanKind.SERVER, attributes)
    return Child(span, parent, judges=False)


def end_request(status: int, outcome: str, attributes: Attributes) -> None:
    """What the request came to, on its span (the current one) when it records: a 5xx is an
    error of the server's, with its outcome (`gateway.errors.Outcome`) as the error type; a
    refused request (4xx) names its outcome but is not the server's failure."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attributes(attributes)
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("querygate.outcome", outcome)
    if outcome != "ok":
        span.set_attribute("error.type", outcome)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR, outcome))
