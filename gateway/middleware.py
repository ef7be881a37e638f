"""Request ids, in-flight accounting, and the one place errors become JSON bodies."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from backends.errors import BackendUnavailable, UpstreamError
from gateway.errors import GatewayError
from gateway.logs import request_id_var
from gateway.metrics import Metrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def error_response(
    status: int, kind: str, message: str, retry_after_s: int | None = None
) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body = {"error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


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


def error_middleware(metrics: Metrics) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        metrics.inflight.inc()
        try:
            return await handler(request)
        except GatewayError as exc:
            return error_response(exc.status, exc.type, exc.message, exc.retry_after_s)
        except BackendUnavailable as exc:
            log.warning("dependency unavailable", extra={"backend": exc.backend, "error": str(exc)})
            metrics.requests.labels("none", "unavailable", "miss").inc()
            return error_response(503, "unavailable", str(exc), exc.retry_after_s)
        except UpstreamError as exc:
            log.warning("upstream error", extra={"backend": exc.backend, "error": str(exc)})
            metrics.requests.labels("none", "upstream_error", "miss").inc()
            return error_response(503, "upstream_error", str(exc), 5)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, _http_kind(exc.status), exc.reason)
        except Exception:
            log.exception("unhandled error")
            metrics.requests.labels("none", "error", "miss").inc()
            return error_response(500, "internal_error", "internal error; see the gateway log")
        finally:
            metrics.inflight.dec()

    return middleware


def _http_kind(status: int) -> str:
    return {
        404: "not_found",
        405: "method_not_allowed",
        413: "payload_too_large",
    }.get(status, "bad_request")
