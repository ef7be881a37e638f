"""Typed keys into aiohttp's mappings: what lives as long as the app, and what one request's
middleware hands to its handler.

Every key the HTTP layer reads is here. The one key only the server reads, the live-reload
controller, stays beside it in gateway/server/reload.py: naming its type here would import
the server from the layer below it."""

from __future__ import annotations

from aiohttp import web

from gateway.core.freshness import FreshnessBoard
from gateway.core.health import Readiness
from gateway.core.runtime import Runtime
from gateway.core.scope import RequestScope
from gateway.core.services import Services
from gateway.ingest.background import BackgroundIngest
from gateway.obs.accounting import RequestRecord
from gateway.obs.metrics import Metrics


class RuntimeHolder:
    """One reference to the active Runtime; a reload replaces it in one assignment."""

    def __init__(self, runtime: Runtime) -> None:
        self.current = runtime


METRICS = web.AppKey("metrics", Metrics)
SERVICES = web.AppKey("services", Services)
RUNTIME = web.AppKey("runtime", RuntimeHolder)
READINESS = web.AppKey("readiness", Readiness)
FRESHNESS = web.AppKey("freshness", FreshnessBoard)
# Present while an ingest runs inside this process (`serve --sample-corpus`).
INGEST = web.AppKey("ingest", BackgroundIngest)

# Every request's id, from the request id middleware.
REQUEST_ID = web.RequestKey("request_id", str)
# Every request's accounting record, from the outcome middleware.
RECORD = web.RequestKey("record", RequestRecord)
# The scope of a limited request (`limits_middleware`): its tenant, deadline and record.
SCOPE = web.RequestKey("scope", RequestScope)
