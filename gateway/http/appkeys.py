"""Typed keys into the aiohttp application: what lives as long as the app.

Every key the HTTP layer reads is here. The one key only the server reads, the live-reload
controller, stays beside it in gateway/server/reload.py: naming its type here would import
the server from the layer below it."""

from __future__ import annotations

from aiohttp import web

from gateway.core.health import Readiness
from gateway.core.pipeline import Services
from gateway.core.runtime import Runtime
from gateway.ingest.background import BackgroundIngest
from gateway.obs.metrics import Metrics


class RuntimeHolder:
    """One reference to the active Runtime; a reload replaces it in one assignment."""

    def __init__(self, runtime: Runtime) -> None:
        self.current = runtime


METRICS = web.AppKey("metrics", Metrics)
SERVICES = web.AppKey("services", Services)
RUNTIME = web.AppKey("runtime", RuntimeHolder)
READINESS = web.AppKey("readiness", Readiness)
# Present while an ingest runs inside this process (`serve --sample-corpus`).
INGEST = web.AppKey("ingest", BackgroundIngest)
