"""The outermost middleware: every request gets an id, echoed in `X-Request-Id` and put on
each log record written while it runs (`gateway.obs.logs`)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.http.appkeys import REQUEST_ID
from gateway.obs.logs import request_id_var

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def request_id_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # A caller's own id is kept when it is safe to log; otherwise we make one.
        given = request.headers.get("X-Request-Id", "")
        request_id = given if _CLIENT_REQUEST_ID.match(given) else uuid.uuid4().hex
        request[REQUEST_ID] = request_id
        token = request_id_var.set(request_id)
        try:
            response = await handler(request)
        finally:
            request_id_var.reset(token)
        if not response.prepared:
            response.headers["X-Request-Id"] = request_id
        return response

    return middleware
