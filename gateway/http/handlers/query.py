"""`POST /v1/query` and `POST /v1/route`: parse and validate, call the pipeline, shape the answer.

No business logic; the chat endpoint (`gateway.http.handlers.chat`) shares the limits,
`Cache-Control` and answering helpers below."""

from __future__ import annotations

from aiohttp import web

from backends.llm.base import Message
from gateway.core.guard import request_guard
from gateway.core.request import QueryRequest
from gateway.core.result import QueryResult
from gateway.core.runtime import Runtime
from gateway.core.scope import RequestScope
from gateway.errors import Unprocessable
from gateway.http.appkeys import METRICS, REQUEST_ID, RUNTIME, SCOPE
from gateway.http.body import parse_body
from gateway.http.schemas import QueryBody, RouteBody
from gateway.http.streaming import stream_query
from gateway.http.wire import decision_body, partial_headers, query_body
from gateway.obs.timing import StageTimer


def check_limits(runtime: Runtime, query: str, history_len: int) -> None:
    server = runtime.settings.server
    if len(query) > server.max_query_chars:
        raise Unprocessable(f"query: longer than {server.max_query_chars} characters")
    if history_len > server.max_history_messages:
        raise Unprocessable(f"history: more than {server.max_history_messages} messages")


def cache_control(request: web.Request) -> tuple[bool, bool]:
    """(look up, store): the request's `Cache-Control`. `no-cache` (or `Pragma: no-cache`)
    answers afresh without looking in the cache, though the answer may be stored; `no-store`
    keeps it out of the cache."""
    directives = {
        part.split("=", 1)[0].strip().lower()
        for header in request.headers.getall("Cache-Control", [])
        for part in header.split(",")
    }
    pragma = request.headers.get("Pragma", "").strip().lower() == "no-cache"
    return not ("no-cache" in directives or pragma), "no-store" not in directives


async def answer(runtime: Runtime, query: QueryRequest, scope: RequestScope) -> QueryResult:
    async with request_guard(scope.deadline):
        prepared = await runtime.pipeline.prepare(query, scope)
        return await runtime.pipeline.complete(prepared)


async def handle_query(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME].current
    scope = request[SCOPE]
    body = await parse_body(request, QueryBody)
    check_limits(runtime, body.query, len(body.history))
    lookup, store = cache_control(request)
    query = QueryRequest(
        id=request[REQUEST_ID],
        tenant=scope.tenant,
        query=body.query,
        history=tuple(Message(m.role, m.content) for m in body.history),
        route=body.route,
        cache_lookup=lookup,
        cache_store=store,
    )
    if body.stream:
        return await stream_query(request, runtime, query, scope, debug=body.debug)
    result = await answer(runtime, query, scope)
    return web.json_response(
        query_body(result, debug=body.debug), headers=partial_headers(result.partial_index)
    )


async def handle_route(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    scope = request[SCOPE]
    body = await parse_body(request, RouteBody)
    check_limits(runtime, body.query, 0)
    timer = StageTimer(request.app[METRICS])
    query = QueryRequest(
        id=request[REQUEST_ID], tenant=scope.tenant, query=body.query, route=body.route
    )
    async with request_guard(scope.deadline):
        decision = await runtime.pipeline.decide(query, timer)
    return web.json_response(
        {
            "id": query.id,
            **decision_body(decision),
            "timings_ms": timer.report(),
            "config_version": runtime.pipeline.config_version,
        }
    )
