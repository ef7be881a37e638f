"""HTTP handlers: parse and validate, call the pipeline, shape the answer. No business logic."""

from __future__ import annotations

import json
import logging
from typing import TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from backends.llm.base import Message
from gateway.core.guard import request_guard
from gateway.core.health import READINESS
from gateway.core.pipeline import QueryRequest
from gateway.core.runtime import Runtime
from gateway.errors import BadRequest, Unprocessable, clip, listed
from gateway.http.appkeys import BUDGET_CHECK, METRICS, RUNTIME
from gateway.http.middleware.limits import read_body
from gateway.http.schemas import QueryBody, RouteBody
from gateway.http.streaming import stream_query
from gateway.http.wire import QueryResult, decision_body, query_body
from gateway.ingest.background import INGEST
from gateway.obs.timing import StageTimer
from gateway.server.workers import pool_counts

Model = TypeVar("Model", bound=BaseModel)

log = logging.getLogger(__name__)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def load_json(raw: bytes) -> object:
    """The body as JSON, or 400 saying why not: strict UTF-8 and standard JSON only (no NaN or
    Infinity), integers of at most 4,300 digits, nesting under Python's recursion limit."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest("the body is not valid JSON: nested too deeply") from exc
    except ValueError as exc:  # NaN, Infinity, an integer over 4,300 digits
        reason = "an integer with over 4,300 digits" if "digits" in str(exc) else str(exc)
        raise BadRequest(f"the body is not valid JSON: {reason}") from exc


async def parse_body(request: web.Request, model: type[Model]) -> Model:
    # Already read by the limits middleware (then this returns it at once).
    server = request.app[RUNTIME].current.settings.server
    data = load_json(await read_body(request, server.body_read_timeout_s))
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise Unprocessable(describe_validation(exc)) from exc


def describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        field = ".".join(clip(str(p)) for p in err["loc"]) or "body"
        parts.append(f"{field}: {err['msg']}")
    return listed(parts)


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


async def answer(runtime: Runtime, query: QueryRequest) -> QueryResult:
    async with request_guard(runtime.settings.server.request_timeout_s):
        prepared = await runtime.pipeline.prepare(query)
        return await runtime.pipeline.complete(prepared)


async def handle_query(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    body = await parse_body(request, QueryBody)
    check_limits(runtime, body.query, len(body.history))
    lookup, store = cache_control(request)
    query = QueryRequest(
        id=request["request_id"],
        tenant=tenant,
        query=body.query,
        history=tuple(Message(m.role, m.content) for m in body.history),
        route=body.route,
        cache_lookup=lookup,
        cache_store=store,
        budget=request.get(BUDGET_CHECK),
    )
    if body.stream:
        return await stream_query(request, runtime, query, debug=body.debug)
    result = await answer(runtime, query)
    return web.json_response(query_body(result, debug=body.debug))


async def handle_route(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    body = await parse_body(request, RouteBody)
    check_limits(runtime, body.query, 0)
    timer = StageTimer(request.app[METRICS])
    query = QueryRequest(
        id=request["request_id"], tenant=tenant, query=body.query, route=body.route
    )
    async with request_guard(runtime.settings.server.request_timeout_s):
        decision = await runtime.pipeline.decide(query, timer)
    return web.json_response(
        {
            "id": query.id,
            **decision_body(decision),
            "timings_ms": timer.report(),
            "config_version": runtime.settings.version,
        }
    )


async def handle_healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def handle_readyz(request: web.Request) -> web.Response:
    """Ready (200) when retrieval answers; 503 with Retry-After when it does not.

    The cache is optional: without it every request is a miss and is still answered (the
    cache fails open). So a cache that is down leaves readiness at 200 and says
    `"status": "degraded"` with the cache's check `unavailable`: a Redis outage is shared by
    every replica, and a 503 would pull them all out of the load balancer at once for a
    dependency they can serve without. The checks come from `gateway.core.health.Readiness`: this
    endpoint is unauthenticated, so however often it is called each backend is pinged at most
    once per `READYZ_MAX_AGE_S` (1 s), and a change is seen within about that; each probe
    pings afresh (the pool reconnects by itself), so the status clears when Redis is back.

    A background ingest (`serve --sample-corpus`) adds `"ingest"`: its state, documents done
    and total, rate and ETA, and `partial_index` while answers come from the documents indexed
    so far. It does not change readiness: the gateway answers meanwhile.

    Under `serve --workers N`, `"workers": {"serving", "expected"}` as the supervisor counts
    them: fewer than N serving (one crashed, or failing to start) is `degraded`, still ready
    (the others answer); none is not ready (a worker answering this has not been counted yet,
    for at most 0.2 s, or the pod is draining)."""
    checks = await request.app[READINESS].checks()
    pool = pool_counts()
    ready = checks["retrieval"] == "ok" and (pool is None or pool[0] > 0)
    degraded = [name for name, state in checks.items() if state != "ok" and name != "retrieval"]
    short = pool is not None and pool[0] < pool[1]
    status = "unavailable" if not ready else "degraded" if degraded or short else "ok"
    runtime = request.app[RUNTIME].current
    body: dict[str, object] = {
        "ready": ready,
        "status": status,
        "checks": dict(checks),
        "config_version": runtime.settings.version,
    }
    if pool is not None:
        body["workers"] = {"serving": pool[0], "expected": pool[1]}
    if (ingest := request.app.get(INGEST)) is not None:
        body["ingest"] = ingest.progress.snapshot()
    headers = None if ready else {"Retry-After": "5"}
    return web.json_response(body, status=200 if ready else 503, headers=headers)


async def handle_metrics(request: web.Request) -> web.Response:
    payload = request.app[METRICS].exposition()
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})
