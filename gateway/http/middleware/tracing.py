"""The tracing middleware, between the request id and the outcome: each request's server span
(`gateway.obs.tracing`), current while the request runs, so its stages' spans are its children
and its log line (written by the outcome middleware inside it) names its trace. Installed only
when tracing is on: off, a request never passes through it. The health probes and the
scrape are not traced."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.http.appkeys import REQUEST_ID
from gateway.http.failures import endpoint_of
from gateway.obs import tracing
from gateway.obs.logs import PROBES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def tracing_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        endpoint = endpoint_of(request)  # "POST /v1/query": the route's template, a closed set
        if endpoint in PROBES:  # asked every few seconds by the orchestrator and the scraper
            return await handler(request)
        route = endpoint.partition(" ")[2] or endpoint
        attributes = {
            "http.request.method": request.method,
            "http.route": route,
            "url.scheme": request.scheme,
            "querygate.request_id": request.get(REQUEST_ID, ""),
        }
        # The outcome middleware inside says what the request came to (`end_request`).
        with tracing.open_request(endpoint, request.headers, attributes):
            return await handler(request)

    return middleware
