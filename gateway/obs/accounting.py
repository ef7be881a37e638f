"""Request accounting: what each request's outcome is, its counter increment and log line.

The outcome middleware (`gateway.http.middleware.outcome`) opens a `RequestRecord` for each
request and puts it on the request (the `RequestScope` carries it into the core); whatever runs
for the request (admission, the finisher's `_observe`, a stream that ends with an error event)
adds to it, and every request, ok or not, ends with one `account` call: one counter increment
and one log line. What an exception means (its outcome, the closed set `gateway.errors.Outcome`,
and the JSON error the client gets) is `gateway.errors`' table; its HTTP side is
`gateway.http.failures`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import Failure, Outcome
from gateway.obs import tracing
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)

# Endpoints whose answers the pipeline counts in querygate_requests_total; their failures are
# counted there too (route "none"), so that counter covers every outcome of an answer.
ANSWERING = frozenset({"POST /v1/query", "POST /v1/chat/completions", "POST /v1/completions"})
_WARNED: frozenset[Outcome] = frozenset(
    {"deadline", "unavailable", "upstream_error", "shed_process"}
)
# The log line's fields a request span carries too: names of closed sets, counts and costs.
_SPAN_FIELDS = (
    "request_id",
    "tenant",
    "route",
    "cache",
    "escalated",
    "agent_steps",
    "cost_usd",
    "prompt_tokens",
    "completion_tokens",
)


@dataclass(slots=True)
class RequestRecord:
    endpoint: str
    started: float = field(default_factory=time.perf_counter)
    tenant: str | None = None
    # Set by the pipeline when it counted an answer in querygate_requests_total.
    answered: bool = False
    # Set when the response went out (a stream) but the request failed after it.
    failure: Failure | None = None
    # Fields for the request's one log line (route, cache, cost, tokens, ...).
    fields: dict[str, Any] = field(default_factory=dict)
    # The client shaped the model calls (generation parameters, tools, tool results): a model's
    # refusal of them as invalid is the client's to fix (400), not an upstream failure (503).
    client_shaped: bool = False

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


def account(
    metrics: Metrics,
    request_id: str | None,
    record: RequestRecord,
    status: int,
    outcome: Outcome,
    error: str | None = None,
    bug: BaseException | None = None,
) -> None:
    """The request's one counter increment and one log line."""
    elapsed = record.elapsed_s()
    metrics.http_requests.labels(record.endpoint, outcome).inc()
    metrics.http_request_duration.labels(record.endpoint).observe(elapsed)
    if record.endpoint in ANSWERING and not record.answered:
        metrics.requests.labels("none", outcome, "miss").inc()
    fields: dict[str, Any] = {
        "request_id": request_id,
        "tenant": record.tenant,
        "endpoint": record.endpoint,
        "status": 499 if outcome == "disconnect" else status,
        "outcome": outcome,
        "duration_ms": round(elapsed * 1000, 3),
        **record.fields,
    }
    if error is not None:
        fields["error"] = error
    if tracing.recording():
        spanned = {f"querygate.{k}": fields[k] for k in _SPAN_FIELDS if fields.get(k) is not None}
        tracing.end_request(fields["status"], outcome, spanned)
    if bug is not None:
        log.error("request failed", extra=fields, exc_info=bug)
    elif outcome in _WARNED:
        log.warning("request", extra=fields)
    else:
        log.info("request", extra=fields)
