"""The models of a tier's chain as called: each with its API key resolved and its breakers.

A tier's `TierConfig` lists a model and its fallbacks; `chain` turns that into `Deployment`s,
failing at start-up when an API key's environment variable is not set rather than on the first
request hours later. A `Lease` is one admitted call to a deployment, whose verdict reaches the
breakers exactly once.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from backends.llm import openai_http
from backends.llm.base import TierConfig, Usage
from backends.llm.breakers import ModelBreaker, Pass

# The OpenAI SDK insists on a non-empty key even for upstreams that need none (local servers).
KEYLESS_PLACEHOLDER = "sk-no-key-configured"


@dataclass(frozen=True, slots=True)
class Deployment:
    """One model of a tier's chain with its API key resolved and its breaker."""

    config: TierConfig
    api_key: str
    name: str  # the model, plus "#position" if the chain lists it twice (two api_bases)
    breaker: ModelBreaker
    # Served by the lean wire (an OpenAI-compatible upstream), not litellm.acompletion.
    lean: bool = False

    @property
    def model(self) -> str:
        return self.config.model

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Usage:
        cost = (
            prompt_tokens * self.config.input_cost_per_token
            + completion_tokens * self.config.output_cost_per_token
        )
        return Usage(prompt_tokens, completion_tokens, cost)


@dataclass(slots=True)
class Lease:
    """An admitted call to one deployment: its verdict reaches the breaker exactly once."""

    deployment: Deployment
    admitted: Pass
    settled: bool = False

    def settle(self, verdict: bool | None) -> None:
        if self.settled:
            return
        self.settled = True
        self.deployment.breaker.record(self.admitted, verdict)


def resolve_api_key(owner: str, env_var: str | None) -> str:
    """The key in `env_var` (a placeholder when none is named), for the model `owner`; raises
    at start-up, not on the first request hours later, when the variable is not set."""
    if env_var is None:
        return KEYLESS_PLACEHOLDER
    key = os.environ.get(env_var, "")
    if not key:
        raise ValueError(f"{owner}: environment variable {env_var} is not set")
    return key


def _resolve_key(config: TierConfig) -> str:
    return resolve_api_key(config.model, config.api_key_env)


def deployment_names(config: TierConfig | None) -> list[str]:
    """The names of a tier's deployments, in chain order (the metric and log `model`): the
    model, plus "#position" when the chain lists it twice (two api_bases)."""
    if config is None:
        return []
    configs = (config, *config.fallbacks)
    listed = Counter(c.model for c in configs)
    return [c.model if listed[c.model] == 1 else f"{c.model}#{i}" for i, c in enumerate(configs)]


def build_chain(
    config: TierConfig | None,
    clock: Callable[[], float],
    lean_http: bool,
    on_change: Callable[[str, float, str | None, bool], None],
) -> tuple[Deployment, ...]:
    """The tier's deployments; `on_change(name, cooldown_s, tenant, is_open)` hears their
    breakers flip (tenant None: the shared breaker)."""
    if config is None:
        return ()
    deployments = []
    for c, name in zip((config, *config.fallbacks), deployment_names(config), strict=True):

        def changed(
            tenant: str | None, is_open: bool, name: str = name, cooldown_s: float = c.cooldown_s
        ) -> None:
            on_change(name, cooldown_s, tenant, is_open)

        breaker = ModelBreaker(c.cooldown_after, c.cooldown_s, clock, changed)
        lean = lean_http and openai_http.serves(c.model)
        deployments.append(Deployment(c, _resolve_key(c), name, breaker, lean=lean))
    return tuple(deployments)
