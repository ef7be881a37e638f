"""Typed keys into the aiohttp application (what lives as long as the app) and its requests."""

from __future__ import annotations

from aiohttp import web

from gateway.core.pipeline import Services
from gateway.core.runtime import Runtime
from gateway.limits.quotas import BudgetCheck
from gateway.obs.metrics import Metrics


class RuntimeHolder:
    """One reference to the active Runtime; a reload replaces it in one assignment."""

    def __init__(self, runtime: Runtime) -> None:
        self.current = runtime


METRICS = web.AppKey("metrics", Metrics)
SERVICES = web.AppKey("services", Services)
RUNTIME = web.AppKey("runtime", RuntimeHolder)

# The budget check a request passed on arrival (the limits middleware; absent: no budget
# applies), standing for its first model call.
BUDGET_CHECK = web.RequestKey("budget_check", BudgetCheck)
