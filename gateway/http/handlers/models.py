"""`GET /v1/models` and `GET /v1/models/{model}`: the model names a client may send.

A "model" here is a route: `auto` (the gateway decides) and each route a request may force
(direct, lookup, multihop; full context is only ever chosen by the gateway) — the names
`/v1/query` takes as `route`. The chat and completion endpoints accept exactly these names (404
for any other). A route this deployment cannot execute (multihop without a large model) is
still accepted, as `/v1/query` accepts it, and answered by lookup with `route_reason` saying
so; its entry here says so too (`querygate.answered_by`). A tenant that may not force a route
is listed `auto` alone, and forcing one is 403.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from gateway.core.runtime import Runtime
from gateway.errors import NotFound, clip
from gateway.http.appkeys import RECORD, RUNTIME
from gateway.settings import TenantConfig
from routers.types import Route

AUTO = "auto"
FORCEABLE = (Route.DIRECT, Route.LOOKUP, Route.MULTIHOP)
MODELS = (AUTO, *(route.value for route in FORCEABLE))
# OpenAI's `created` is a Unix time; these models came to be when this process started.
_STARTED = int(time.time())


def tenant_models(tenant: TenantConfig) -> tuple[str, ...]:
    """What `tenant` may send: `auto` alone unless it may force a route."""
    return MODELS if tenant.allow_force_route else (AUTO,)


def model_not_found(model: str, known: tuple[str, ...]) -> NotFound:
    return NotFound(f"model {clip(model)!r} does not exist here; use one of {', '.join(known)}")


def check_model(model: str) -> None:
    """404 for a name that is no route (a tenant's right to force one is the policy's: 403)."""
    if model not in MODELS:
        raise model_not_found(model, MODELS)


def _model(runtime: Runtime, name: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "querygate",
    }
    if name != AUTO and Route(name) not in runtime.pipeline.routes:
        body["querygate"] = {
            "answered_by": Route.LOOKUP.value,
            "reason": f"the {name} route needs a model this deployment does not have",
        }
    return body


def _tenant_models(request: web.Request) -> tuple[Runtime, tuple[str, ...]]:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    request[RECORD].tenant = tenant.id
    return runtime, tenant_models(tenant)


async def handle_models(request: web.Request) -> web.Response:
    runtime, models = _tenant_models(request)
    return web.json_response({"object": "list", "data": [_model(runtime, m) for m in models]})


async def handle_model(request: web.Request) -> web.Response:
    runtime, models = _tenant_models(request)
    name = request.match_info["model"]
    if name not in models:
        raise model_not_found(name, models)
    return web.json_response(_model(runtime, name))
