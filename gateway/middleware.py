"""Request ids, admission and deadlines, and the one place errors become JSON bodies.

Order (outermost first): request id → outcome (errors to JSON, counting and the one log line
per request) → admission (the deadline, the body read under its own timeout, the tenant's
admission to its pool). /healthz, /readyz, /metrics and /admin/reload bypass admission.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError
from aiohttp.web_urldispatcher import SystemRoute

from backends.errors import BackendUnavailable, UpstreamError
from gateway.accounting import RequestRecord, current_record
from gateway.admission import Admission, Saturated, TenantOverShare
from gateway.appkeys import RUNTIME
from gateway.errors import (
    BadRequest,
    DeadlineExceeded,
    GatewayError,
    PayloadTooLarge,
    RequestTimeout,
)
from gateway.guard import DEADLINE_RETRY_AFTER_S, request_deadline
from gateway.logs import request_id_var
from gateway.metrics import Metrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# The class of work of each admitted endpoint; anything else bypasses admission.
POOLS = {
    "POST /v1/query": "queries",
    "POST /v1/chat/completions": "queries",
    "POST /v1/route": "queries",
    "PUT /v1/documents/{doc_id}": "writes",
    "DELETE /v1/documents/{doc_id}": "writes",
}
# Endpoints whose answers the pipeline counts in querygate_requests_total; their failures are
# counted there too (route "none"), so that counter covers every outcome of an answer.
_ANSWERING = {"POST /v1/query", "POST /v1/chat/completions"}


class ClientGone(ConnectionResetError):
    """The client closed the connection while we read its request."""


def error_response(
    status: int, kind: str, message: str, retry_after_s: int | None = None
) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body = {"error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def endpoint_of(request: web.Request) -> str:
    """The method and route template: a closed set (unknown paths are 'unmatched')."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or isinstance(route, SystemRoute):
        return "unmatched"
    path = re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", resource.canonical)
    return f"{route.method} {path}"


def request_id_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # A caller's own id is kept when it is safe to log; otherwise we make one.
        given = request.headers.get("X-Request-Id", "")
        request_id = given if _CLIENT_REQUEST_ID.match(given) else uuid.uuid4().hex
        request["request_id"] = request_id
        token = request_id_var.set(request_id)
        try:
            response = await handler(request)
        finally:
            request_id_var.reset(token)
        if not response.prepared:
            response.headers["X-Request-Id"] = request_id
        return response

    return middleware


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _gateway_outcome(exc: GatewayError) -> str:
    if isinstance(exc, TenantOverShare):
        return "shed_tenant"
    if isinstance(exc, Saturated):
        return "shed_process"
    if isinstance(exc, DeadlineExceeded):
        return "deadline"
    if isinstance(exc, RequestTimeout):
        return "body_timeout"
    return _status_outcome(exc.status)


def _status_outcome(status: int) -> str:
    if status == 503:
        return "unavailable"
    if status >= 500:
        return "error"
    if status >= 400:
        return "client_error"
    return "ok"


def error_middleware(metrics: Metrics) -> Middleware:
    """Every exception becomes a JSON error; every request is counted and logged once."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        record = RequestRecord(endpoint_of(request))
        token = current_record.set(record)
        metrics.inflight.inc()
        error: str | None = None
        failure: BaseException | None = None
        try:
            response = await handler(request)
            outcome = _status_outcome(response.status)
        except GatewayError as exc:
            outcome, error = _gateway_outcome(exc), exc.message
            response = error_response(exc.status, exc.type, exc.message, exc.retry_after_s)
        except BackendUnavailable as exc:
            # The detail (a client library's text) goes to the log line, never to the client.
            outcome, error = "unavailable", str(exc)
            message = f"{exc.backend} is unavailable; try again"
            response = error_response(503, "unavailable", message, exc.retry_after_s)
        except UpstreamError as exc:
            outcome, error = "upstream_error", str(exc)
            message = f"{exc.backend} answered with an error; try again"
            response = error_response(503, "upstream_error", message, 5)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            outcome, error = _status_outcome(exc.status), exc.reason
            response = error_response(exc.status, _http_kind(exc.status), exc.reason)
        except asyncio.CancelledError:
            outcome = "disconnect" if _client_gone(request) else "cancelled"
            _account(metrics, request, record, 499, outcome, None, None)
            raise
        except ClientGone:
            outcome, error = "disconnect", None
            response = web.Response(status=499)  # nobody reads it
        except ConnectionError as exc:
            if not _client_gone(request):  # not the client's connection: our failure
                outcome, error, failure = "error", "internal error", exc
                response = _internal_error()
            else:
                outcome, error = "disconnect", None
                response = web.Response(status=499)  # nobody reads it
        except Exception as exc:
            outcome, error, failure = "error", "internal error", exc
            response = _internal_error()
        finally:
            metrics.inflight.dec()
            current_record.reset(token)
        if outcome in ("ok", "client_error") and _client_gone(request):
            outcome = "disconnect"  # the answer was ready, the client was not there for it
        _account(metrics, request, record, response.status, outcome, error, failure)
        return response

    return middleware


def _internal_error() -> web.Response:
    return error_response(500, "internal_error", "internal error; see the gateway log")


def _account(
    metrics: Metrics,
    request: web.Request,
    record: RequestRecord,
    status: int,
    outcome: str,
    error: str | None,
    failure: BaseException | None,
) -> None:
    """The request's one counter increment and one log line."""
    elapsed = record.elapsed_s()
    metrics.http_requests.labels(record.endpoint, outcome).inc()
    metrics.http_request_duration.labels(record.endpoint).observe(elapsed)
    if record.endpoint in _ANSWERING and not record.answered:
        metrics.requests.labels("none", outcome, "miss").inc()
    fields: dict[str, Any] = {
        "request_id": request.get("request_id"),
        "tenant": record.tenant,
        "endpoint": record.endpoint,
        "status": 499 if outcome == "disconnect" else status,
        "outcome": outcome,
        "duration_ms": round(elapsed * 1000, 3),
        **record.fields,
    }
    if error is not None:
        fields["error"] = error
    if failure is not None:
        log.error("request failed", extra=fields, exc_info=failure)
    elif outcome in ("deadline", "unavailable", "upstream_error", "shed_process"):
        log.warning("request", extra=fields)
    else:
        log.info("request", extra=fields)


def admission_middleware(admission: Admission) -> Middleware:
    """Deadline from arrival, body read under its own timeout, then the tenant's admission.

    The body is read before admission so a slow client holds no slot while it trickles; the
    tenant is resolved before the body so an unknown key costs no read.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        record = current_record.get()
        kind = POOLS.get(record.endpoint if record else endpoint_of(request))
        if kind is None:
            return await handler(request)
        runtime = request.app[RUNTIME].current
        server = runtime.settings.server
        loop = asyncio.get_running_loop()
        timeout_s = server.write_timeout_s if kind == "writes" else server.request_timeout_s
        deadline = loop.time() + timeout_s
        deadline_token = request_deadline.set(deadline)
        try:
            tenant = runtime.tenant_for(request.headers.get("Authorization"))
            if record is not None:
                record.tenant = tenant.id
            await _read_body(request, min(server.body_read_timeout_s, timeout_s))
            config = server.admission
            limits = config.writes if kind == "writes" else config.queries
            async with admission.pool(kind).admit(tenant.id, deadline, limits, config):
                if kind == "queries":
                    # The handlers' own guards end at `deadline` (request_deadline).
                    return await handler(request)
                try:
                    async with asyncio.timeout_at(deadline):
                        return await handler(request)
                except TimeoutError as exc:
                    raise DeadlineExceeded(
                        "the request deadline passed", retry_after_s=DEADLINE_RETRY_AFTER_S
                    ) from exc
        finally:
            request_deadline.reset(deadline_token)

    return middleware


async def _read_body(request: web.Request, timeout_s: float) -> None:
    """Read (and cache: `request.read()` returns it again) the whole body, or refuse."""
    if not request.body_exists:
        return
    try:
        async with asyncio.timeout(timeout_s):
            await request.read()
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body over {request.client_max_size} bytes") from exc
    except ConnectionError as exc:
        raise ClientGone("the client closed the connection during the body") from exc
    except HttpProcessingError as exc:  # a corrupt gzip/deflate body, a broken chunked body
        raise BadRequest(f"the request body cannot be decoded: {exc.message}") from exc
    except RequestPayloadError as exc:  # how aiohttp's reader reports the same (zlib's error)
        raise BadRequest("the request body cannot be decoded (Content-Encoding?)") from exc


def _http_kind(status: int) -> str:
    return {
        404: "not_found",
        405: "method_not_allowed",
        413: "payload_too_large",
    }.get(status, "bad_request")
