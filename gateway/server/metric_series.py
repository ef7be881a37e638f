"""The series every metric family with a closed label set starts with, at 0, in each process:
each worker of `serve --workers N` makes them in its own files when its app starts (so the
summed /metrics has them from the first scrape, and again once a worker is replaced). What the
shipped dashboard and alerts read then shows 0, not "No data", and `rate()` over it is 0 rather
than empty. A rule a reload adds has its series from its first decision (models and the
reranker are restart-only).

Every value is its owner's closed set (routes, outcomes, cache tiers, guards, caps, stages,
pools) or the configuration's (tiers and their models, the rules, the retrieval backend, the
reranker), and the endpoints are the app's routes: nothing per question, document or tenant.
Left to their first value: `querygate_dependency_up` (0 would say "down" before the first
probe, which runs at start) and `querygate_config_info` (set at start)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, get_args

from backends.llm.base import Cut, Tier
from backends.llm.deployments import deployment_names
from gateway.cache.guards import GUARDS
from gateway.cache.response import LookupResult, NotStored
from gateway.cache.stages import CacheTier
from gateway.core.services import Services
from gateway.errors import Outcome
from gateway.limits.admission import POOLS
from gateway.limits.quotas import LOCAL_CHECKS, QUOTA_REASONS
from gateway.obs.accounting import ANSWERING
from gateway.obs.timing import STAGES
from gateway.server.reload import ReloadResult
from gateway.settings import Settings
from routers.policy import decision_labels
from routers.rerank import RerankDecision
from routers.types import Cap, Degraded, GradeReason, Route

Series = dict[str, Sequence[tuple[str, ...]]]


def initial_series(settings: Settings, services: Services, endpoints: Iterable[str]) -> Series:
    """Each labelled family's known series, by family name (`Metrics.initialise` makes them)."""
    return {
        **_answers(endpoints),
        **_models(settings),
        **_retrieval(settings, services),
        "querygate_stage_duration_seconds": [(stage,) for stage in STAGES],
        "querygate_route_decisions": decision_labels(settings.router),
        "querygate_escalations": [
            (Route.LOOKUP.value, to, reason)
            for to in (Route.MULTIHOP.value, "none")  # "none": multihop cannot run here
            for reason in _values(GradeReason)
            if reason != "sufficient"
        ],
        "querygate_cache_lookups": [(result,) for result in _values(LookupResult)],
        "querygate_cache_not_stored": [(reason,) for reason in _values(NotStored)],
        "querygate_cache_guard_refusals": [(guard,) for guard in GUARDS],
        "querygate_agent_cap_hits": [(cap,) for cap in _values(Cap)],
        "querygate_agent_degraded": [(answer,) for answer in _values(Degraded)],
        "querygate_admission_inflight": [(pool,) for pool in POOLS],
        "querygate_admission_queued": [(pool,) for pool in POOLS],
        "querygate_config_reloads": [(result,) for result in _values(ReloadResult)],
        "querygate_quota_refusals": [(reason,) for reason in QUOTA_REASONS],
        "querygate_quota_local_decisions": [(check,) for check in LOCAL_CHECKS],
    }


def _answers(endpoints: Iterable[str]) -> Series:
    """Requests: each endpoint ok, the answering ones with every outcome (what the SLO alerts
    divide), answers by route and cache tier, failed answers by outcome (route "none")."""
    routes = [route.value for route in Route]
    failures = [outcome for outcome in _values(Outcome) if outcome != "ok"]
    named = list(endpoints)
    return {
        "querygate_http_requests": [
            *((endpoint, "ok") for endpoint in named),
            *((endpoint, outcome) for endpoint in sorted(ANSWERING) for outcome in failures),
        ],
        "querygate_http_request_duration_seconds": [(endpoint,) for endpoint in named],
        "querygate_requests": [
            *((route, "ok", tier) for route in routes for tier in _values(CacheTier)),
            *(("none", outcome, "miss") for outcome in failures),
        ],
        "querygate_request_duration_seconds": [(route,) for route in routes],
    }


def _models(settings: Settings) -> Series:
    """Model calls by configured tier and model (a failure's model is "-"), cost per route
    too, and each deployment's cooldown gauges (closed, at 0)."""
    tiers = {tier: getattr(settings.models, tier) for tier in _values(Tier)}
    models = [
        (tier, model)
        for tier, config in tiers.items()
        if config is not None
        for model in dict.fromkeys(c.model for c in (config, *config.fallbacks))
    ]
    deployed = [(tier, name) for tier, config in tiers.items() for name in deployment_names(config)]
    return {
        "querygate_llm_requests": [
            *((tier, model, "ok") for tier, model in models),
            *((tier, "-", "error") for tier, config in tiers.items() if config is not None),
        ],
        "querygate_llm_tokens": [
            (tier, model, direction)
            for tier, model in models
            for direction in ("prompt", "completion")
        ],
        "querygate_llm_cost_usd": [
            (tier, model, route.value) for tier, model in models for route in Route
        ],
        "querygate_llm_replies_cut": [
            (tier, cut)
            for tier, config in tiers.items()
            if config is not None
            for cut in _values(Cut)
        ],
        "querygate_llm_cooldown_open": deployed,
        "querygate_llm_tenant_cooldowns": deployed,
    }


def _retrieval(settings: Settings, services: Services) -> Series:
    """The retrieval histogram of the serving backend, and the rerank stage's families."""
    kind = settings.retrieval.rerank.reranker
    reranker = services.reranker
    return {
        "querygate_retrieval_duration_seconds": [(services.retriever.name, "hybrid")],
        "querygate_rerank": [(decision,) for decision in _values(RerankDecision)],
        "querygate_rerank_duration_seconds": [] if kind == "off" else [(kind,)],
        "querygate_rerank_cost_usd": [] if reranker is None else [(reranker.model_id,)],
    }


def _values(literal: Any) -> list[str]:
    """The strings of a `Literal` type, a union of them flattened."""
    values: list[str] = []
    for arg in get_args(literal):
        values += [arg] if isinstance(arg, str) else _values(arg)
    return values
