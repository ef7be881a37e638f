"""The application factory: routes, middleware, and backends that live as long as the app."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path

from aiohttp import web

from gateway.core.freshness import FreshnessBoard, watch_freshness
from gateway.core.health import Readiness, watch_dependencies
from gateway.core.runtime import Runtime, build_runtime
from gateway.core.services import Services
from gateway.http.appkeys import (
    FRESHNESS,
    INGEST,
    METRICS,
    READINESS,
    RUNTIME,
    SERVICES,
    RuntimeHolder,
)
from gateway.http.failures import endpoints
from gateway.http.handlers.chat import handle_chat_completions
from gateway.http.handlers.completions import handle_completions
from gateway.http.handlers.documents import handle_delete_document, handle_put_document
from gateway.http.handlers.embeddings import handle_embeddings
from gateway.http.handlers.health import handle_healthz, handle_metrics, handle_readyz
from gateway.http.handlers.models import handle_model, handle_models
from gateway.http.handlers.query import handle_query, handle_route
from gateway.http.middleware.limits import limits_middleware
from gateway.http.middleware.outcome import outcome_middleware
from gateway.http.middleware.request_id import request_id_middleware
from gateway.http.middleware.tracing import tracing_middleware
from gateway.ingest.background import BackgroundIngest
from gateway.limits.admission import Admission
from gateway.obs.metrics import Metrics
from gateway.server import heap
from gateway.server.admin import handle_config, handle_reload
from gateway.server.metric_series import initial_series
from gateway.server.reload import Prepare, as_is, live_config
from gateway.server.services import open_services
from gateway.settings import Settings

log = logging.getLogger(__name__)

HEALTH_EVERY_S = 10.0


class AdmittingHolder(RuntimeHolder):
    """The active Runtime; a reload that changes the admission limits applies them at once,
    so waiters that fit the raised limits run now, not when some request ends."""

    def __init__(self, runtime: Runtime, admission: Admission) -> None:
        self._admission = admission
        super().__init__(runtime)

    @property
    def current(self) -> Runtime:
        return self._current

    @current.setter
    def current(self, runtime: Runtime) -> None:
        self._current = runtime
        self._admission.configure(runtime.settings.server.admission)


def create_app(
    settings: Settings,
    config_path: Path | None = None,
    prepare: Prepare = as_is,
    *,
    services: Services | None = None,
    startup_ingest: BackgroundIngest | None = None,
    freeze_heap: bool = False,
    traced: bool = False,
) -> web.Application:
    """`config_path` is the file a reload re-reads; `prepare` re-applies the CLI's overrides;
    `services` are backends the caller opened and closes (an in-process test's fakes; their
    `metrics` are the app's), else the app opens those `settings` name for its lifetime;
    `startup_ingest` runs in the background once the backends are up (the sample corpus on
    first run), while the gateway answers from what is indexed so far; `freeze_heap` (the
    server's own process, not an in-process test) freezes the start-up heap before "ready";
    `traced`: this process installed tracing (`gateway.obs.tracing.install`), so each request
    gets its span."""
    metrics = Metrics() if services is None else services.metrics
    admission = Admission(metrics)  # per process: each worker admits on its own
    spans = [tracing_middleware()] if traced else []
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=[
            request_id_middleware(),
            *spans,
            outcome_middleware(metrics),
            limits_middleware(admission),
        ],
    )
    app[METRICS] = metrics

    def opened() -> AbstractAsyncContextManager[Services]:
        return open_services(settings, metrics) if services is None else nullcontext(services)

    async def backends(app: web.Application) -> AsyncIterator[None]:
        async with opened() as live:
            app[SERVICES] = live
            app[READINESS] = Readiness(live)
            runtime = build_runtime(settings, live)
            app[RUNTIME] = AdmittingHolder(runtime, admission)
            metrics.config_info.labels(settings.version).set(1)
            metrics.initialise(initial_series(settings, live, endpoints(app)))
            health = asyncio.create_task(watch_dependencies(live, metrics, HEALTH_EVERY_S))
            app[FRESHNESS] = FreshnessBoard()
            freshness = asyncio.create_task(
                watch_freshness(
                    live, metrics, lambda: app[RUNTIME].current.settings, app[FRESHNESS]
                )
            )
            ingest = None
            if startup_ingest is not None:
                app[INGEST] = startup_ingest
                ingest = asyncio.create_task(
                    startup_ingest.run(live.embedder, live.retriever, live.ingests)
                )
            if freeze_heap:
                heap.freeze()
            log.info("ready", extra={"config_version": settings.version})
            yield
            health.cancel()
            freshness.cancel()
            if ingest is not None:
                ingest.cancel()  # whole documents only are written: the next start resumes
                await asyncio.gather(ingest, return_exceptions=True)

    async def resources(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(metrics.publish_resources())
        yield
        task.cancel()

    app.cleanup_ctx.append(backends)
    app.cleanup_ctx.append(resources)
    app.cleanup_ctx.append(live_config(config_path, prepare))
    app.router.add_post("/v1/query", handle_query)
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_post("/v1/embeddings", handle_embeddings)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/v1/models/{model}", handle_model)
    app.router.add_post("/v1/route", handle_route)
    # Any character, a line break too: an id is refused by its rules (422 naming them), not by
    # a route that does not match it (404)
    app.router.add_put(r"/v1/documents/{doc_id:[\s\S]+}", handle_put_document)
    app.router.add_delete(r"/v1/documents/{doc_id:[\s\S]+}", handle_delete_document)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/admin/reload", handle_reload)
    app.router.add_get("/admin/config", handle_config)
    return app
