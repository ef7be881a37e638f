"""`GET /v1/models` and `GET /v1/models/{model}`: the model names a client may send.

A "model" here is a route: `auto` (the gateway decides) and each route this deployment can
execute that a request may force (direct, lookup, multihop; full context is only ever chosen by
the gateway). The chat endpoint accepts exactly `deployment_models` as `model` (404 for any
other); a tenant that may not force a route is listed `auto` alone, and forcing one is 403.
"""

from __future__ import annotations

import time

from aiohttp import web

from gateway.core.runtime import Runtime
from gateway.errors import NotFound, clip
from gateway.http.appkeys import RECORD, RUNTIME
from gateway.settings import TenantConfig
from routers.types import Route

AUTO = "auto"
FORCEABLE = (Route.DIRECT, Route.LOOKUP, Route.MULTIHOP)
# OpenAI's `created` is a Unix time; these models came to be when this process started.
_STARTED = int(time.time())


def deployment_models(runtime: Runtime) -> tuple[str, ...]:
    """`auto` and every route a request may force that this deployment can execute."""
    routes = runtime.pipeline.routes
    return (AUTO, *(route.value for route in FORCEABLE if route in routes))


def tenant_models(runtime: Runtime, tenant: TenantConfig) -> tuple[str, ...]:
    """What `tenant` may send: `auto` alone unless it may force a route."""
    return deployment_models(runtime) if tenant.allow_force_route else (AUTO,)


def model_not_found(model: str, known: tuple[str, ...]) -> NotFound:
    return NotFound(f"model {clip(model)!r} does not exist here; use one of {', '.join(known)}")


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": "querygate"}


def _tenant_models(request: web.Request) -> tuple[str, ...]:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    request[RECORD].tenant = tenant.id
    return tenant_models(runtime, tenant)


async def handle_models(request: web.Request) -> web.Response:
    models = _tenant_models(request)
    return web.json_response({"object": "list", "data": [_model(m) for m in models]})


async def handle_model(request: web.Request) -> web.Response:
    models = _tenant_models(request)
    name = request.match_info["model"]
    if name not in models:
        raise model_not_found(name, models)
    return web.json_response(_model(name))
