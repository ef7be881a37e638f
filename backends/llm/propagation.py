"""The W3C trace context of the current span (`traceparent`, `tracestate`), as headers for a
request to an OpenAI-compatible upstream, so its spans join the gateway's trace.

Through the OpenTelemetry API's global propagator (`OTEL_PROPAGATORS`, W3C trace context by
default), which needs no SDK: the gateway's tracing (gateway/obs/tracing.py) makes the model
call's span current while the upstream is asked. With no valid span in the context (tracing
off) there is nothing to send and nothing is built."""

from __future__ import annotations

from opentelemetry import propagate, trace


def trace_headers() -> dict[str, str]:
    """The headers that carry the current trace context; empty without one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier
