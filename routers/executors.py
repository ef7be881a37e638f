"""Routes as executors: one callable per route, and the registry a deployment builds.

A route is executable exactly when the registry holds an executor for it; the policy reads
that set, so a route this deployment cannot run is never chosen silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from backends.llm.base import Tier
from backends.rerank.base import Reranker
from routers.agent import AgentDeps, MultihopExecutor
from routers.agent_caps import AgentConfig
from routers.direct import DirectExecutor, model_only_params
from routers.extractive import Extractor
from routers.full_context import FullContextExecutor
from routers.lookup import LookupExecutor, LookupParams
from routers.types import (
    Answer,
    Escalation,
    Generation,
    OptionNotHonoured,
    Route,
    RouteContext,
)


class Executor(Protocol):
    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation: ...


Registry = Mapping[Route, Executor]


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    # The tier each route's model calls use.
    tiers: Mapping[Route, Tier]
    lookup: LookupParams
    agent: AgentConfig
    full_context: bool


def route_tiers(
    config: RegistryConfig, has_tier: Callable[[Tier], bool]
) -> dict[Route, Tier | None]:
    """Each route this deployment can execute, with the tier that serves it (None: it answers
    without a model: lookup quotes the passages' best sentences, direct answers small talk
    with a fixed note and looks the rest up)."""

    def served(route: Route) -> Tier | None:
        tier = config.tiers[route]
        return tier if has_tier(tier) else None

    routes = {Route.DIRECT: served(Route.DIRECT), Route.LOOKUP: served(Route.LOOKUP)}
    # The agent and the whole-corpus read need a model: without one they do not exist here.
    if served(Route.MULTIHOP) is not None:
        routes[Route.MULTIHOP] = served(Route.MULTIHOP)
    if config.full_context and served(Route.FULL_CONTEXT) is not None:
        routes[Route.FULL_CONTEXT] = served(Route.FULL_CONTEXT)
    return routes


class FromSources:
    """A route that answers from sources, refusing before any work the parameters only the
    direct route honours (client tools, a response format): its answer is cited prose."""

    def __init__(self, route: Route, inner: Executor) -> None:
        self._route = route
        self._inner = inner

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        if wanted := model_only_params(ctx):
            raise OptionNotHonoured(
                f"{wanted}: the question was routed to {self._route.value}, which answers from "
                "the documents and cannot honour it; send model 'direct' for a plain model call"
            )
        return await self._inner(ctx)


class WithoutModel:
    """A route with no model (its answer quoted from the passages, or a fixed note), refusing
    before any work the generation parameters such an answer cannot honour: it ends where the
    quote ends, not at a client's stop sequence, and repeats what the documents repeat. What
    it can honour is not refused: `max_tokens` (the answer is cut), and `temperature`, `top_p`
    and `seed`, met as they stand since nothing is sampled (the answer is what temperature 0
    asks, the same for the same request)."""

    def __init__(self, route: Route, inner: Executor) -> None:
        self._route = route
        self._inner = inner

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        if wanted := unsampled_params(ctx):
            raise OptionNotHonoured(
                f"{wanted}: no model is configured for the {self._route.value} route, so its "
                "answer is not generated and cannot honour it"
            )
        return await self._inner(ctx)


def unsampled_params(ctx: RouteContext) -> str:
    """The generation parameters set that an answer written by no model cannot honour."""
    options = ctx.options
    wanted = {
        "stop": bool(options.stop),
        "frequency_penalty": bool(options.frequency_penalty),
        "presence_penalty": bool(options.presence_penalty),
    }
    return ", ".join(name for name, asked in wanted.items() if asked)


def build_registry(
    deps: AgentDeps, config: RegistryConfig, reranker: Reranker | None = None
) -> dict[Route, Executor]:
    """`reranker`: orders the sentences of an extractive answer (None: the embedder does)."""
    tiers = route_tiers(config, deps.llm.has_tier)
    extractor = Extractor(deps.embedder, reranker)
    lookup = LookupExecutor(
        deps.retriever, config.lookup, tiers[Route.LOOKUP], extractor, deps.rerank
    )
    registry: dict[Route, Executor] = {
        Route.DIRECT: DirectExecutor(tiers[Route.DIRECT], lookup, extractor.count),
        Route.LOOKUP: lookup,
    }
    if (tier := tiers.get(Route.MULTIHOP)) is not None:
        # The lookup's model answers from the passages found when the agent's fails mid-loop.
        degraded = tiers[Route.LOOKUP]
        registry[Route.MULTIHOP] = MultihopExecutor(deps, config.agent, tier, degraded)
    if (tier := tiers.get(Route.FULL_CONTEXT)) is not None:
        registry[Route.FULL_CONTEXT] = FullContextExecutor(tier, tiers.get(Route.MULTIHOP))
    for route in (Route.DIRECT, Route.LOOKUP):
        if tiers[route] is None:
            registry[route] = WithoutModel(route, registry[route])
    return {
        route: executor if route is Route.DIRECT else FromSources(route, executor)
        for route, executor in registry.items()
    }
