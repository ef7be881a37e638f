"""Routes as executors: one callable per route, and the registry a deployment builds.

A route is executable exactly when the registry holds an executor for it; the policy reads
that set, so a route this deployment cannot run is never chosen silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from backends.llm.base import Tier
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


class Refusing:
    """A route that refuses, before any work, the parameters its answer cannot honour:
    `refused(ctx)` names them ("" for none), `why` ends the 400's message.

    - `from_sources`: a route that answers from sources refuses what only the direct route
      honours (client tools, a response format): its answer is cited prose.
    - `without_model`: a route with no model (its answer quoted from the passages, or a fixed
      note) refuses what such an answer cannot honour: it ends where the quote ends, not at a
      client's stop sequence, and repeats what the documents repeat. What it can honour is not
      refused: `max_tokens` (the answer is cut), and `temperature`, `top_p` and `seed`, met as
      they stand since nothing is sampled (the answer is what temperature 0 asks, the same for
      the same request)."""

    def __init__(self, inner: Executor, refused: Callable[[RouteContext], str], why: str) -> None:
        self._inner = inner
        self._refused = refused
        self._why = why

    @classmethod
    def from_sources(cls, route: Route, inner: Executor) -> Refusing:
        why = (
            f"the question was routed to {route.value}, which answers from the documents and "
            "cannot honour it; send model 'direct' for a plain model call"
        )
        return cls(inner, model_only_params, why)

    @classmethod
    def without_model(cls, route: Route, inner: Executor) -> Refusing:
        why = (
            f"no model is configured for the {route.value} route, so its answer is not "
            "generated and cannot honour it"
        )
        return cls(inner, unsampled_params, why)

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        if wanted := self._refused(ctx):
            raise OptionNotHonoured(f"{wanted}: {self._why}")
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


def build_registry(deps: AgentDeps, config: RegistryConfig) -> dict[Route, Executor]:
    """The executor of every route the configuration can run; `deps.rerank` is the second
    stage of every search, and the order an extractive answer cites a reranked search in."""
    tiers = route_tiers(config, deps.llm.has_tier)
    extractor = Extractor(deps.embedder, search_order=deps.rerank.enabled)
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
            registry[route] = Refusing.without_model(route, registry[route])
    return {
        route: executor if route is Route.DIRECT else Refusing.from_sources(route, executor)
        for route, executor in registry.items()
    }
