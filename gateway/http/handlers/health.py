"""`GET /healthz`, `/readyz` and `/metrics`: unauthenticated, unlimited, answered at once."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.errors import Forbidden, Unauthorized
from gateway.http.appkeys import FRESHNESS, INGEST, METRICS, READINESS, RUNTIME, SERVICES
from gateway.obs.pool import pool_counts


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
    Retrieval `degraded` (an OpenSearch cluster with a node down, serving every shard) is
    ready too, `"status": "degraded"`: the cluster absorbs the fault (gateway.core.health).

    `ready` is serving; `complete` says whether the answers come from whole indexes: false
    while an ingest of this process (`serve --sample-corpus`) is still filling one, when those
    answers carry `partial_index`. It does not change readiness, so a probe keeps the pod in
    the load balancer while it answers. That ingest adds `"ingest"`: its state, documents
    done, unchanged and total, rate and ETA, and `partial_index`.

    Under `serve --workers N`, `"workers": {"serving", "expected"}` as the supervisor counts
    them: fewer than N serving (one crashed, or failing to start) is `degraded`, still ready
    (the others answer); none is not ready (a worker answering this has not been counted yet,
    for at most 0.2 s, or the pod is draining).

    `"index"`: how many configured tenants there are and how many have a stale index (no change
    within their `expect_writes_within_s`), naming none, since anyone may call this; called with
    the admin key (`Authorization: Bearer <admin key>`), `"index"` also has `"tenants_detail"`:
    each tenant's documents, chunks, last write, serving version, model and staleness, as read
    at most `gateway.core.freshness.EVERY_S` ago."""
    checks = await request.app[READINESS].checks()
    pool = pool_counts()
    ready = checks["retrieval"] != "unavailable" and (pool is None or pool[0] > 0)
    degraded = [name for name, state in checks.items() if state != "ok"]
    short = pool is not None and pool[0] < pool[1]
    status = "unavailable" if not ready else "degraded" if degraded or short else "ok"
    runtime = request.app[RUNTIME].current
    body: dict[str, object] = {
        "ready": ready,
        "status": status,
        "complete": request.app[SERVICES].ingests.complete,
        "checks": dict(checks),
        "config_version": runtime.pipeline.config_version,  # hashed once per configuration
    }
    if pool is not None:
        body["workers"] = {"serving": pool[0], "expected": pool[1]}
    if (board := request.app.get(FRESHNESS)) is not None:
        index: dict[str, object] = dict(board.summary())
        if _is_admin(request):
            index["tenants_detail"] = board.per_tenant()
        body["index"] = index
    if (ingest := request.app.get(INGEST)) is not None:
        body["ingest"] = ingest.progress.snapshot()
    headers = None if ready else {"Retry-After": "5"}
    return web.json_response(body, status=200 if ready else 503, headers=headers)


def _is_admin(request: web.Request) -> bool:
    """Whether the request carries the admin key; any other (or none) sees the summary only."""
    authorization = request.headers.get("Authorization")
    if authorization is None:
        return False
    try:
        request.app[RUNTIME].current.check_admin(authorization)
    except (Forbidden, Unauthorized):
        return False
    return True


async def handle_metrics(request: web.Request) -> web.Response:
    """Every family; those labelled by tenant (index freshness) only for the admin key, so an
    unauthenticated scrape names no tenant."""
    payload = request.app[METRICS].exposition(tenants=_is_admin(request))
    return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})
