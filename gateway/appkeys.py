"""Typed keys into the aiohttp application: what lives as long as the app."""

from __future__ import annotations

from aiohttp import web

from gateway.metrics import Metrics
from gateway.pipeline import Services
from gateway.runtime import Runtime


class RuntimeHolder:
    """One reference to the active Runtime; a reload replaces it in one assignment."""

    def __init__(self, runtime: Runtime) -> None:
        self.current = runtime


METRICS = web.AppKey("metrics", Metrics)
SERVICES = web.AppKey("services", Services)
RUNTIME = web.AppKey("runtime", RuntimeHolder)
