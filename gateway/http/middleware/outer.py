"""The middleware chain's outer two: request ids, and the outcome of every request.

Order (outermost first): request id → outcome (every exception to a JSON error, and the one
count and log line per request, `gateway.obs.accounting`) → limits
(`gateway.http.middleware.limits`: the deadline,
the body read under its own timeout, the tenant's admission to its pool).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.errors import status_outcome
from gateway.http.appkeys import RECORD
from gateway.obs.accounting import (
    RequestRecord,
    account,
    endpoint_of,
    failure_of,
    failure_response,
)
from gateway.obs.logs import request_id_var
from gateway.obs.metrics import Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


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


def error_middleware(metrics: Metrics) -> Middleware:
    """Every exception becomes a JSON error; every request is counted and logged once."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        record = request[RECORD] = RequestRecord(endpoint_of(request))
        metrics.inflight.inc()
        request_id = request.get("request_id")
        error: str | None = None
        bug: BaseException | None = None
        try:
            response = await handler(request)
            outcome = status_outcome(response.status)
            if record.failure is not None:  # a stream that ended with an error event
                outcome, error, bug = (
                    record.failure.outcome,
                    record.failure.error,
                    record.failure.bug,
                )
        except asyncio.CancelledError:
            outcome = "disconnect" if _client_gone(request) else "cancelled"
            account(metrics, request_id, record, 499, outcome)
            raise
        except Exception as exc:
            if isinstance(exc, web.HTTPException) and exc.status < 400:
                raise  # a redirect is an answer
            failure = failure_of(
                exc, client_gone=_client_gone(request), client_shaped=record.client_shaped
            )
            outcome, error, bug = failure.outcome, failure.error, failure.bug
            response = failure_response(failure)
        finally:
            metrics.inflight.dec()
        if outcome in ("ok", "client_error") and _client_gone(request):
            outcome = "disconnect"  # the answer was ready, the client was not there for it
        account(metrics, request_id, record, response.status, outcome, error, bug)
        return response

    return middleware
