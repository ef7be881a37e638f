"""Request accounting: what each request's outcome is, its counter increment and log line.

The outcome middleware (`gateway.http.middleware.outer`) opens a `RequestRecord` for each
request and puts it on the request (the `RequestScope` carries it into the core); whatever runs
for the request (admission, the finisher's `_observe`, a stream that ends with an error event)
adds to it, and every request, ok or not, ends with one `account` call: one counter
increment and one log line. `failure_of` maps an exception to its outcome (the closed set
`gateway.errors.Outcome`) and to the JSON error the client gets.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_urldispatcher import SystemRoute

from backends.errors import BackendUnavailable, UpstreamError, UpstreamRefused
from backends.retrieval.base import EmptyDocument
from gateway.errors import ClientGone, GatewayError, Outcome
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)

# Endpoints whose answers the pipeline counts in querygate_requests_total; their failures are
# counted there too (route "none"), so that counter covers every outcome of an answer.
ANSWERING = frozenset({"POST /v1/query", "POST /v1/chat/completions"})
_WARNED: frozenset[Outcome] = frozenset(
    {"deadline", "unavailable", "upstream_error", "shed_process"}
)
NO_PASSAGE = "text: no passage to index (headings only?); add body text"
REFUSED_AS_INVALID = (
    "the model refused this request as invalid: check its parameters, tools and messages "
    "(the model's reason is in the gateway's log under this request id)"
)


@dataclass(frozen=True, slots=True)
class Failure:
    """How a request failed: its outcome, the JSON error the client gets, what the log says."""

    outcome: Outcome
    status: int
    kind: str
    message: str  # written for the client
    error: str | None  # for the log line (may carry a library's detail)
    retry_after_s: int | None = None
    bug: BaseException | None = None  # ours: its traceback goes to the log line

    def response(self) -> web.Response:
        if self.outcome == "disconnect":
            return web.Response(status=499)  # nobody reads it
        return error_response(self.status, self.kind, self.message, self.retry_after_s)


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


def endpoint_of(request: web.Request) -> str:
    """The method and route template: a closed set (unknown paths are 'unmatched')."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or isinstance(route, SystemRoute):
        return "unmatched"
    path = re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", resource.canonical)
    return f"{route.method} {path}"


def error_response(
    status: int, kind: str, message: str, retry_after_s: int | None = None
) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body = {"error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def status_outcome(status: int) -> Outcome:
    if status == 503:
        return "unavailable"
    if status >= 500:
        return "error"
    if status >= 400:
        return "client_error"
    return "ok"


def failure_of(exc: Exception, *, client_gone: bool, client_shaped: bool = False) -> Failure:
    """The failure an exception means. `client_gone`: the client's connection is closed;
    `client_shaped`: the request's `RequestRecord.client_shaped`."""
    if isinstance(exc, GatewayError):
        error = exc.message if exc.detail is None else f"{exc.message}: {exc.detail}"
        outcome = exc.outcome or status_outcome(exc.status)
        return Failure(outcome, exc.status, exc.type, exc.message, error, exc.retry_after_s)
    if isinstance(exc, EmptyDocument):  # the backend's refusal, before any write
        return Failure("client_error", 422, "validation_error", NO_PASSAGE, str(exc))
    if isinstance(exc, BackendUnavailable):
        # The detail (a client library's text) goes to the log line, never to the client.
        message = f"{exc.backend} is unavailable; try again"
        return Failure("unavailable", 503, "unavailable", message, str(exc), exc.retry_after_s)
    if isinstance(exc, UpstreamRefused) and client_shaped:
        return Failure("client_error", 400, "bad_request", REFUSED_AS_INVALID, str(exc))
    if isinstance(exc, UpstreamError):
        message = f"{exc.backend} answered with an error; try again"
        return Failure("upstream_error", 503, "upstream_error", message, str(exc), 5)
    if isinstance(exc, web.HTTPException):  # aiohttp's own: 404, 405, 413
        kind = _HTTP_KINDS.get(exc.status, "bad_request")
        return Failure(status_outcome(exc.status), exc.status, kind, exc.reason, exc.reason)
    if isinstance(exc, ClientGone) or (isinstance(exc, ConnectionError) and client_gone):
        return Failure("disconnect", 499, "disconnect", "", None)
    # Anything else (a ConnectionError not on the client's connection included) is our bug.
    message = "internal error; see the gateway log"
    return Failure("error", 500, "internal_error", message, "internal error", bug=exc)


_HTTP_KINDS = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


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
    if bug is not None:
        log.error("request failed", extra=fields, exc_info=bug)
    elif outcome in _WARNED:
        log.warning("request", extra=fields)
    else:
        log.info("request", extra=fields)
