"""The LLM seam over litellm: small/large tiers, each a chain of models, retried and cooled down.

One retry layer only: the OpenAI SDK inside litellm is told `max_retries=0` and this retries
transient failures (connection errors, timeouts, 429, 5xx) with bounded exponential backoff,
`retries` times per model. Then the tier's `fallbacks` are tried in order. Failures that a retry
cannot fix (4xx other than 429, a malformed body) are not retried but do move on to the next
fallback, which may be another provider or deployment (`backends.llm.failures`).

Each model of a chain has circuit breakers (`backends.llm.breakers.ModelBreaker`): after
`cooldown_after` consecutive failed calls (transient or malformed, each counted once its retries
are spent) the model is skipped for `cooldown_s`, so a dead primary stops costing every request
its retries and backoff. Then one request probes it, without retries: success puts it back,
failure skips it for another `cooldown_s`. Failures are counted per tenant (`LLMCall.tenant`): a
tenant's own failures cool the model down for that tenant alone, and it is cooled down for
everyone only once the failures come from at least two tenants (or from the only tenant seen):
one tenant's requests never take a model from the others. A refused request (4xx other than
429) is the request's fault and tells the breakers nothing. When every model of a tier is
skipped, `BackendUnavailable` is raised without calling anyone, `retry_after_s` being the time
until the first may be probed. Breakers live in this object, so each worker process keeps its
own.

`litellm.Router` is deliberately not used: it costs 1.5-2x the CPU per call and adds its own
retry layer. OpenAI-compatible deployments (`openai/<model>`) do not go through
`litellm.acompletion` at all but through one pooled aiohttp session (`backends.llm.openai_http`,
`lean_http=True`, the default): the same retries, fallbacks, cooldowns and cost, a tenth of the
CPU per call; litellm still serves every other provider and counts tokens for estimates.

Every call reads its reply only as far as its bound (`backends.llm.bounds`): the lean wire and
litellm's OpenAI-compatible calls (`backends.llm.bounded_httpx`) by bytes as they read, and
every answer by tokens once read; a reply cut there says so (`Completion.cut`).
"""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import litellm
from litellm import ModelResponse
from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

from backends.errors import BackendUnavailable, UpstreamError
from backends.llm import openai_http
from backends.llm.base import Completion, LLMCall, StreamDelta, Tier, TierConfig
from backends.llm.bounded_httpx import BoundedClients
from backends.llm.bounds import Reading, ReplyBound, fit_tokens, reply_bound
from backends.llm.deployments import Deployment, Lease, build_chain
from backends.llm.failures import CALL_ERRORS, classify, exhausted, verdict
from backends.llm.relay import LeanStream, LitellmStream, OpenStream, relay
from backends.llm.retrying import retrying
from backends.llm.wire import (
    estimate_usage,
    from_json,
    from_litellm,
    lean_body,
    litellm_args,
    reply_limit,
    text_counter,
    to_wire,
)

log = logging.getLogger(__name__)

# litellm prints a "Give Feedback / Get Help" banner to stdout on every exception; it would
# interleave with the gateway's structured log lines.
litellm.suppress_debug_info = True

WARM_UP_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "warm-up"}]

T = TypeVar("T")


class LiteLLMTiers:
    """`LLM` over litellm: a small and a large tier, each a model plus ordered fallbacks."""

    def __init__(
        self,
        small: TierConfig | None,
        large: TierConfig | None,
        *,
        backoff_initial_s: float = 0.25,
        backoff_max_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_cooldown: Callable[[str, str, bool], None] | None = None,
        on_tenant_cooldowns: Callable[[str, str, int], None] | None = None,
        lean_http: bool = True,
    ) -> None:
        """`on_cooldown(tier, model, is_open)` hears every shared breaker opening and closing,
        `on_tenant_cooldowns(tier, model, tenants)` how many tenants a model is cooled down for
        by their own breakers, whenever that changes (no tenant id: metrics labels stay
        bounded); `lean_http` sends OpenAI-compatible deployments over `openai_http`, not
        litellm. The tenant a call is for is its `LLMCall.tenant`."""
        self._on_cooldown = on_cooldown
        self._on_tenant_cooldowns = on_tenant_cooldowns
        configs: dict[Tier, TierConfig | None] = {"small": small, "large": large}
        self._chains = {
            tier: build_chain(config, clock, lean_http, functools.partial(self._flipped, tier))
            for tier, config in configs.items()
        }
        self._http = openai_http.OpenAIHttp()
        self._bounded = BoundedClients()  # litellm's client for OpenAI-compatible upstreams
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s

    def has_tier(self, tier: Tier) -> bool:
        return bool(self._chains[tier])

    def prices(self, tier: Tier) -> tuple[float, float]:
        configs = [d.config for d in self._chains[tier]]
        return (
            max((c.input_cost_per_token for c in configs), default=0.0),
            max((c.output_cost_per_token for c in configs), default=0.0),
        )

    def cooldowns(self) -> dict[tuple[str, str], float]:
        """Models being skipped or probed for every tenant, by (tier, model): seconds until a
        probe may go."""
        return {
            (tier, d.name): d.breaker.shared.seconds_left()
            for tier, chain in self._chains.items()
            for d in chain
            if d.breaker.shared.is_open
        }

    def tenant_cooldowns(self) -> dict[tuple[str, str], int]:
        """Models cooled down for some tenants alone, by (tier, model): how many tenants."""
        return {
            (tier, d.name): n
            for tier, chain in self._chains.items()
            for d in chain
            if (n := d.breaker.tenants_cooling())
        }

    async def warm_up(self) -> None:
        """Run litellm's lazy imports and setup now rather than on the first real request.

        The first `acompletion` in a process pays for litellm's lazy imports and setup, a
        request's worth of latency. A mocked call per model exercises
        the same code path without touching the upstream (no tokens billed, works while the
        upstream is still starting). The lean wire's session opens here too.
        """
        if any(d.lean for chain in self._chains.values() for d in chain):
            self._http.start()
        for chain in self._chains.values():
            for deployment in chain:
                await litellm.acompletion(
                    model=deployment.model, messages=WARM_UP_MESSAGES, mock_response="ok"
                )
                # streaming has its own lazily built path (chunk wrapper, usage builder)
                stream = await litellm.acompletion(
                    model=deployment.model,
                    messages=WARM_UP_MESSAGES,
                    mock_response="ok",
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async for _ in stream:
                    pass
                # loads the tokenizer used when a stream arrives without usage
                estimate_usage(deployment.model, WARM_UP_MESSAGES, "ok")

    async def complete(self, call: LLMCall) -> Completion:
        tier, max_tokens, options = call.tier, call.max_tokens, call.options
        tools = list(call.tools) if call.tools is not None else None
        wire = [to_wire(m) for m in call.messages]

        async def attempt(deployment: Deployment) -> Completion:
            bound = reply_bound(deployment.config, reply_limit(deployment, max_tokens, options))
            read = Reading(bound.max_bytes)
            if deployment.lean:
                body = lean_body(deployment, wire, max_tokens, options)
                if tools is not None:
                    body["tools"] = tools
                async with asyncio.timeout(deployment.config.timeout_s):
                    answer = await self._http.complete(
                        deployment.config.api_base,
                        deployment.api_key,
                        body,
                        deployment.config.timeout_s,
                        read,
                    )
                return _bounded(from_json(tier, deployment, wire, answer), read, bound)
            args = litellm_args(deployment, wire, max_tokens, options)
            if tools is not None:
                args["tools"] = tools
            # the SDK timeout bounds each socket operation; this bounds the whole call
            async with asyncio.timeout(deployment.config.timeout_s):
                with self._bounded.bounded(deployment, args, read):
                    response = await litellm.acompletion(**args)
            if not isinstance(response, ModelResponse):
                raise UpstreamError("llm", f"{deployment.model}: unexpected {type(response)}")
            return _bounded(from_litellm(tier, deployment, wire, response), read, bound)

        lease, completion = await self._first_that_answers(tier, call.tenant, attempt)
        lease.settle(True)
        return completion

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        max_tokens, options = call.max_tokens, call.options
        wire = [to_wire(m) for m in call.messages]

        async def attempt(deployment: Deployment) -> OpenStream:
            if deployment.lean:
                return await LeanStream.open(self._http, deployment, wire, max_tokens, options)
            return await LitellmStream.open(deployment, wire, max_tokens, options, self._bounded)

        lease, opened = await self._first_that_answers(call.tier, call.tenant, attempt)
        try:
            async for delta in relay(opened, wire):
                if delta.done:
                    # now, not on exit: a consumer that never closes us must not hold a probe slot
                    lease.settle(True)
                yield delta
        except CALL_ERRORS as exc:
            lease.settle(verdict(exc))  # a stream cut after its first chunk counts too
            raise
        finally:
            lease.settle(None)  # stopped early or cancelled: no verdict (no-op once settled)
            # releases the connection when the consumer stops early
            await opened.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._bounded.aclose()
        # litellm caches its HTTP clients process-wide (the gateway holds one LiteLLMTiers). It
        # leaves closed clients in that cache and would hand them to the next instance, which
        # then fails with "client has been closed": flush it too.
        await close_litellm_async_clients()  # type: ignore[no-untyped-call]  # untyped upstream
        litellm.in_memory_llm_clients_cache.flush_cache()  # type: ignore[no-untyped-call]

    async def _first_that_answers(
        self, tier: Tier, tenant: str, attempt: Callable[[Deployment], Awaitable[T]]
    ) -> tuple[Lease, T]:
        """The first answer along the chain, skipping the models cooling down for `tenant`; the
        caller settles the lease once the answer is used up (a stream can still fail after its
        first chunk)."""
        chain = self._chains[tier]
        if not chain:
            raise BackendUnavailable("llm", f"no model configured for tier {tier!r}")
        failures: list[tuple[str, BaseException]] = []
        cooling: list[Deployment] = []
        for deployment in chain:
            admitted = deployment.breaker.admit(tenant)
            if admitted is None:
                cooling.append(deployment)
                continue
            lease = Lease(deployment, admitted)
            try:
                # a probe is not retried: it only has to tell whether the model is back, and the
                # request it rides on should reach a fallback without the backoff
                attempts = 1 if admitted.is_probe else deployment.config.retries + 1
                return lease, await self._retrying(deployment, attempt, attempts)
            except CALL_ERRORS as exc:
                log.warning("llm %s failed (%s): %s", deployment.name, classify(exc).value, exc)
                failures.append((deployment.name, exc))
                lease.settle(verdict(exc))
            except BaseException:
                lease.settle(None)  # cancelled: no verdict, but free a probe slot
                raise
        left = [(d.name, d.breaker.seconds_left(tenant)) for d in cooling]
        raise exhausted(tier, failures, left)

    def _flipped(
        self, tier: Tier, name: str, cooldown_s: float, tenant: str | None, is_open: bool
    ) -> None:
        if tenant is not None:
            # the tenant is named in the log only, never in a metric label
            if is_open:
                log.warning(
                    "llm %s cooling down for tenant %r alone for %.1f s (its own failed calls)",
                    name,
                    tenant,
                    cooldown_s,
                )
            else:
                log.info("llm %s no longer cooling down for tenant %r", name, tenant)
            if self._on_tenant_cooldowns is not None:
                breaker = next(d.breaker for d in self._chains[tier] if d.name == name)
                self._on_tenant_cooldowns(tier, name, breaker.tenants_cooling())
            return
        if is_open:
            log.warning("llm %s cooling down for every tenant for %.1f s", name, cooldown_s)
        else:
            log.info("llm %s answers again", name)
        if self._on_cooldown is not None:
            self._on_cooldown(tier, name, is_open)

    async def _retrying(
        self,
        deployment: Deployment,
        attempt: Callable[[Deployment], Awaitable[T]],
        attempts: int,
    ) -> T:
        return await retrying(
            functools.partial(attempt, deployment),
            attempts,
            self._backoff_initial_s,
            self._backoff_max_s,
        )


def _bounded(completion: Completion, read: Reading, bound: ReplyBound) -> Completion:
    """`completion` as its bound lets it through: cut to the token bound when its text passes
    it, marked when that or the byte cap cut it (a body cut by bytes holds only the text that
    came, no tool call)."""
    fitted = fit_tokens(text_counter(completion.model), completion.text, bound.max_tokens)
    cut = read.cut or ("tokens" if fitted is not None else None)
    if cut is None:
        return completion
    text = completion.text if fitted is None else fitted
    return replace(completion, text=text, finish_reason="length", cut=cut, tool_calls=())
