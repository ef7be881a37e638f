"""Request accounting: what each request's outcome is, its counter increment and log line.

The outcome middleware (`gateway.http.middleware.outcome`) opens a `RequestRecord` for each
request and puts it on the request (the `RequestScope` carries it into the core); whatever runs
for the request (admission, the finisher's `_observe`, a stream that ends with an error event)
adds to it, and every request, ok or not, ends with one `account` call: one counter increment
and one log line. `failure_of` maps an exception to its outcome (the closed set
`gateway.errors.Outcome`) and to the JSON error the client gets, by `gateway.errors`' table.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_urldispatcher import SystemRoute

from gateway import errors
from gateway.errors import Failure, Outcome, status_outcome
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)

# Endpoints whose answers the pipeline counts in querygate_requests_total; their failures are
# counted there too (route "none"), so that counter covers every outcome of an answer.
ANSWERING = frozenset({"POST /v1/query", "POST /v1/chat/completions"})
_WARNED: frozenset[Outcome] = frozenset(
    {"deadline", "unavailable", "upstream_error", "shed_process"}
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


def failure_of(exc: Exception, *, client_gone: bool, client_shaped: bool = False) -> Failure:
    """The failure an exception means (`gateway.errors.failure_of`, and aiohttp's own HTTP
    exceptions). `client_gone`: the client's connection is closed; `client_shaped`: the
    request's `RequestRecord.client_shaped`."""
    if isinstance(exc, web.HTTPException):  # aiohttp's own: 404, 405, 413
        kind = _HTTP_KINDS.get(exc.status, "bad_request")
        return Failure(status_outcome(exc.status), exc.status, kind, exc.reason, exc.reason)
    return errors.failure_of(exc, client_gone=client_gone, client_shaped=client_shaped)


def failure_response(failure: Failure) -> web.Response:
    if failure.outcome == "disconnect":
        return web.Response(status=499)  # nobody reads it
    return error_response(failure.status, failure.kind, failure.message, failure.retry_after_s)


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
