"""Typed keys into the aiohttp application: what lives as long as the app."""

from __future__ import annotations

from aiohttp import web

from gateway.core.runtime import Runtime
from gateway.core.services import Services
from gateway.obs.metrics import Metrics


class RuntimeHolder:
    """One reference to the active Runtime; a reload replaces it in one assignment."""

    def __init__(self, runtime: Runtime) -> None:
        self.current = runtime


METRICS = web.AppKey("metrics", Metrics)
SERVICES = web.AppKey("services", Services)
RUNTIME = web.AppKey("runtime", RuntimeHolder)
