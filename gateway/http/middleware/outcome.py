"""The outcome middleware, second in the chain: every exception becomes a JSON error (by
`gateway.errors`' table), and every request, ok or not, is counted and logged once
(`gateway.obs.accounting`).

Order (outermost first): request id (`gateway.http.middleware.request_id`) → outcome → limits
(`gateway.http.middleware.limits`: the deadline, the body read under its own timeout, the
tenant's admission to its pool).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.errors import status_outcome
from gateway.http.appkeys import RECORD, REQUEST_ID
from gateway.http.failures import (
    endpoint_of,
    failure_response,
    request_failure,
    routing_failure,
)
from gateway.obs.accounting import RequestRecord, account
from gateway.obs.metrics import Metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def outcome_middleware(metrics: Metrics) -> Middleware:
    """Every exception becomes a JSON error; every request is counted and logged once."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        record = request[RECORD] = RequestRecord(endpoint_of(request))
        metrics.inflight.inc()
        request_id = request.get(REQUEST_ID)
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
            if isinstance(exc, web.HTTPException):  # aiohttp's router: 404, 405, 413
                failure = routing_failure(request, exc)
            else:
                failure = request_failure(
                    exc, client_gone=_client_gone(request), client_shaped=record.client_shaped
                )
            outcome, error, bug = failure.outcome, failure.error, failure.bug
            response = failure_response(failure, exc)
        finally:
            metrics.inflight.dec()
        if outcome in ("ok", "client_error") and _client_gone(request):
            outcome = "disconnect"  # the answer was ready, the client was not there for it
        account(metrics, request_id, record, response.status, outcome, error, bug)
        return response

    return middleware
