"""The LLM seam over `litellm.acompletion`: small/large tiers, retries, fallbacks, exact cost.

One retry layer only: the OpenAI SDK inside litellm is told `max_retries=0` and this retries
transient failures (connection errors, timeouts, 429, 5xx) with bounded exponential backoff,
`retries` times per model. Then the tier's `fallbacks` are tried in order. Failures that a retry
cannot fix (4xx other than 429, a malformed body) are not retried but do move on to the next
fallback, which may be another provider or deployment. When every model failed,
`BackendUnavailable` is raised if any of them failed transiently (trying later may help), else
`UpstreamError`.

Each model of a chain has circuit breakers (`ModelBreaker`): after `cooldown_after` consecutive
failed calls (transient or malformed, each counted once its retries are spent) the model is
skipped for `cooldown_s`, so a dead primary stops costing every request its retries and backoff.
Then one request probes it, without retries: success puts it back, failure skips it for another
`cooldown_s`. Failures are counted per tenant (`calling_tenant`): a tenant's own failures cool
the model down for that tenant alone, and it is cooled down for everyone only once the failures
come from at least two tenants (or from the only tenant seen): one tenant's requests never take
a model from the others. A refused request (4xx other than 429) is the request's fault and tells
the breakers nothing. When every model of a tier is skipped, `BackendUnavailable` is raised
without calling anyone, `retry_after_s` being the time until the first may be probed. Breakers
live in this object, so each worker process keeps its own.

Cost is ours, not litellm's: `response_cost` is None for unregistered models, so cost is the
tier's per-token prices times the usage the upstream reported. On streams a usage chunk is
requested; when the upstream sends none, usage is estimated with `litellm.token_counter` and the
final delta says so (`extra["usage_estimated"]`).

`litellm.Router` is deliberately not used: it costs 1.5-2x the CPU per call and adds its own
retry layer. OpenAI-compatible deployments (`openai/<model>`) do not go through
`litellm.acompletion` at all but through one pooled aiohttp session (`backends.llm.openai_http`,
`lean_http=True`, the default): the same retries, fallbacks, cooldowns and cost, a tenth of the
CPU per call; litellm still serves every other provider and counts tokens for estimates.
"""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import asyncio
import functools
import json
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace
from typing import Any, TypeVar

import litellm
import openai
from litellm import CustomStreamWrapper, ModelResponse
from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

from backends.errors import BackendUnavailable, UpstreamError, UpstreamRefused
from backends.llm import openai_http
from backends.llm.base import (
    NO_OPTIONS,
    Completion,
    GenerationOptions,
    Message,
    StreamDelta,
    Tier,
    TierConfig,
    ToolCall,
    Usage,
    calling_tenant,
)

log = logging.getLogger(__name__)

# litellm prints a "Give Feedback / Get Help" banner to stdout on every exception; it would
# interleave with the gateway's structured log lines.
litellm.suppress_debug_info = True

# The OpenAI SDK insists on a non-empty key even for upstreams that need none (local servers).
KEYLESS_PLACEHOLDER = "sk-no-key-configured"

WARM_UP_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "warm-up"}]

T = TypeVar("T")


class _Failure(Enum):
    TRANSIENT = "transient"  # retry the same model
    MALFORMED = "malformed"  # the upstream answered garbage: try the next model
    REJECTED = "rejected"  # the upstream refused the request: try the next model


class Admission(Enum):
    """How a breaker let a call through."""

    CALL = "call"
    PROBE = "probe"  # the one call let through to a cooling model


class CircuitBreaker:
    """One cooldown: closed, open (skipped), half-open (one probe at a time).

    `threshold` consecutive failures open it (0: never). After `cooldown_s` it admits one probe;
    the probe's success closes it, its failure opens it again. A verdict of None (a refused or
    cancelled call) changes nothing but frees the probe slot. Any call's success closes it, and
    any call's failure while it is open restarts the cooldown: late answers are evidence too.
    `may_open=False` counts a failure without letting it open a closed breaker.
    """

    def __init__(self, threshold: int, cooldown_s: float, clock: Callable[[], float]) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._open_until: float | None = None  # None while closed
        self._probing = False

    @property
    def is_open(self) -> bool:
        """Not closed: open or half-open."""
        return self._open_until is not None

    @property
    def is_idle(self) -> bool:
        """Closed with no failure counted: no different from a new breaker."""
        return self._open_until is None and self._failures == 0

    @property
    def failures(self) -> int:
        return self._failures

    def seconds_left(self) -> float:
        """Until a probe may go: 0 when closed or half-open."""
        if self._open_until is None:
            return 0.0
        return max(0.0, self._open_until - self._clock())

    def stale(self) -> bool:
        """Open, with no probe for a whole cooldown past its due time: nobody is asking."""
        return (
            self._open_until is not None
            and not self._probing
            and self._clock() >= self._open_until + self._cooldown_s
        )

    def admit(self) -> Admission | None:
        """Whether a call may go now (None: skip this model), and whether it is the probe."""
        if self._open_until is None:
            return Admission.CALL
        if self._probing or self._clock() < self._open_until:
            return None
        self._probing = True
        return Admission.PROBE

    def record(self, admitted: Admission, verdict: bool | None, *, may_open: bool = True) -> bool:
        """Take a call's outcome (True ok, False failed, None no verdict); True if it flipped."""
        was_open = self.is_open
        if admitted is Admission.PROBE:
            self._probing = False
        if verdict is True:
            self._failures = 0
            self._open_until = None
        elif verdict is False:
            self._failures += 1
            if was_open or (may_open and 0 < self._threshold <= self._failures):
                self._open_until = self._clock() + self._cooldown_s
        return self.is_open is not was_open

    def close(self) -> bool:
        """Close it, the failures still counted (the evidence was judged too weak to open it);
        True if it was open. A probe still out records its verdict as a late call's."""
        was_open = self.is_open
        self._open_until, self._probing = None, False
        return was_open


@dataclass(frozen=True, slots=True)
class Pass:
    """How a tenant's call was let through: by the model's shared breaker and by its own."""

    tenant: str
    shared: Admission
    own: Admission

    @property
    def is_probe(self) -> bool:
        return Admission.PROBE in (self.shared, self.own)


class ModelBreaker:
    """One model's breakers: one per tenant, and the shared one every tenant obeys.

    A tenant's own `threshold` consecutive failed calls cool the model down for that tenant
    alone (skipped, then probed by that tenant's requests, as `CircuitBreaker`): it stops paying
    retries on a pattern of its own (prompts the upstream times out on or 5xx's) and nobody
    else notices. The shared breaker counts every tenant's failed calls since the model last
    answered anyone, and opens once they are `threshold` or more *and come from at least two
    tenants*: the model failing for more than one tenant is the model failing. One tenant's
    failures, however many, never open it, so a tenant cannot take a model away from the others.

    The exceptions, each so that one tenant's failures cannot keep the model away:
    - a tenant whose own breaker is open is no news about the model: its failed calls (probes,
      late calls admitted before it cooled) do not count in the shared run nor restart an open
      shared cooldown, and while the shared breaker is open its failed probe leaves the shared
      breaker half-open for another tenant to probe, rather than opening it again;
    - while only one tenant has ever asked for the model (a single-tenant deployment, or a
      process that has seen one tenant so far), that tenant's failures are all the evidence
      there is and open the shared breaker at `threshold`, as if tenants did not exist. The
      first call of a second tenant ends that: a shared cooldown opened on one tenant's
      evidence is withdrawn and the newcomer's call goes through.

    Tenant breakers live only while they hold a failure; one left open with nobody probing
    it for a whole cooldown past its due time is forgotten, so their number is bounded by the
    tenants that are failing now. `on_change(tenant, is_open)` hears every flip: tenant None is
    the shared breaker.
    """

    def __init__(
        self,
        threshold: int,
        cooldown_s: float,
        clock: Callable[[], float],
        on_change: Callable[[str | None, bool], None] | None = None,
    ) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._on_change = on_change
        self.shared = CircuitBreaker(threshold, cooldown_s, clock)
        self._own: dict[str, CircuitBreaker] = {}
        # The tenants whose failures are in the shared run (two are enough to know).
        self._run: set[str] = set()
        self._first_tenant: str | None = None
        self._several_tenants = False

    def tenants_cooling(self) -> int:
        """Tenants this model is cooled down for alone (by their own breaker)."""
        return sum(1 for b in self._own.values() if b.is_open)

    def seconds_left(self, tenant: str) -> float:
        """Until `tenant` may call this model again (0: half-open, a probe may go)."""
        own = self._own.get(tenant)
        return max(self.shared.seconds_left(), own.seconds_left() if own is not None else 0.0)

    def admit(self, tenant: str) -> Pass | None:
        """Whether `tenant`'s call may go now (None: skip this model for it)."""
        self._meet(tenant)
        own = self._own.get(tenant)
        if own is not None and own.seconds_left() > 0:
            return None  # cooled alone: not even a shared probe before its own cooldown ends
        shared = self.shared.admit()
        if shared is None:
            return None
        own_admitted = own.admit() if own is not None else Admission.CALL
        if own_admitted is None:  # its own probe is out already
            self.shared.record(shared, None)
            return None
        return Pass(tenant, shared, own_admitted)

    def record(self, admitted: Pass, verdict: bool | None) -> None:
        """Take the outcome of a call `admit` let through."""
        tenant = admitted.tenant
        own = self._own.get(tenant)
        cooled = own is not None and own.is_open  # before this call's verdict
        if own is None and verdict is False:
            own = self._own[tenant] = CircuitBreaker(self._threshold, self._cooldown_s, self._clock)
        if own is not None:
            if own.record(admitted.own, verdict) and self._on_change is not None:
                self._on_change(tenant, own.is_open)
            if own.is_idle:
                del self._own[tenant]
        self._record_shared(admitted, verdict, cooled)

    def _record_shared(self, admitted: Pass, verdict: bool | None, cooled: bool) -> None:
        # Its probes, and its late calls too (admitted before it cooled, failing one by one up
        # to the upstream's timeout): each restarted an open shared cooldown, so one tenant's
        # pattern kept the model from everyone for as long as its calls kept failing.
        known_pattern = cooled and self._several_tenants
        if verdict is False and known_pattern:
            # A cooled tenant's call failing is about that tenant, not the model: it counts for
            # its own breaker only, and a shared probe it carried is handed back, unspent.
            self.shared.record(admitted.shared, None)
            return
        if verdict is True:
            self._run.clear()
        elif verdict is False:
            self._run.add(admitted.tenant)
        spread = len(self._run) >= 2 or not self._several_tenants
        if self.shared.record(admitted.shared, verdict, may_open=spread):
            self._changed(None, self.shared.is_open)

    def _meet(self, tenant: str) -> None:
        """Note who asks; forget tenant breakers nobody probes any more."""
        if self._first_tenant is None:
            self._first_tenant = tenant
        elif not self._several_tenants and tenant != self._first_tenant:
            self._several_tenants = True
            # The shared cooldown stood on one tenant's evidence: withdraw it (the failures
            # stay counted: one of another tenant's will open it again).
            if len(self._run) < 2 and self.shared.close():
                self._changed(None, False)
        if self._own:
            for name in [t for t, b in self._own.items() if b.stale()]:
                del self._own[name]
                self._changed(name, False)

    def _changed(self, tenant: str | None, is_open: bool) -> None:
        if self._on_change is not None:
            self._on_change(tenant, is_open)


@dataclass(frozen=True, slots=True)
class _Deployment:
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
class _Lease:
    """An admitted call to one deployment: its verdict reaches the breaker exactly once."""

    deployment: _Deployment
    admitted: Pass
    settled: bool = False

    def settle(self, verdict: bool | None) -> None:
        if self.settled:
            return
        self.settled = True
        self.deployment.breaker.record(self.admitted, verdict)


@dataclass(frozen=True, slots=True)
class _OpenStream:
    """A stream whose first chunk has arrived: past this point nothing is retried."""

    deployment: _Deployment
    chunks: CustomStreamWrapper | openai_http.SseStream
    first: Any  # litellm's first chunk, or the lean wire's first batch of chunks


def _resolve_key(config: TierConfig) -> str:
    if config.api_key_env is None:
        return KEYLESS_PLACEHOLDER
    key = os.environ.get(config.api_key_env, "")
    if not key:
        # fail at start-up, not on the first request hours later
        raise ValueError(f"{config.model}: environment variable {config.api_key_env} is not set")
    return key


def _chain(
    config: TierConfig | None,
    clock: Callable[[], float],
    lean_http: bool,
    on_change: Callable[[str, float, str | None, bool], None],
) -> tuple[_Deployment, ...]:
    """The tier's deployments; `on_change(name, cooldown_s, tenant, is_open)` hears their
    breakers flip (tenant None: the shared breaker)."""
    if config is None:
        return ()
    configs = (config, *config.fallbacks)
    listed = Counter(c.model for c in configs)
    deployments = []
    for i, c in enumerate(configs):
        name = c.model if listed[c.model] == 1 else f"{c.model}#{i}"

        def changed(
            tenant: str | None, is_open: bool, name: str = name, cooldown_s: float = c.cooldown_s
        ) -> None:
            on_change(name, cooldown_s, tenant, is_open)

        breaker = ModelBreaker(c.cooldown_after, c.cooldown_s, clock, changed)
        lean = lean_http and openai_http.serves(c.model)
        deployments.append(_Deployment(c, _resolve_key(c), name, breaker, lean=lean))
    return tuple(deployments)


def _exception_chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _classify(exc: BaseException) -> _Failure:
    """What kind of failure this is, looking through litellm's re-wrapping.

    litellm maps a refused connection and an unparsable 200 body to `InternalServerError` (500)
    just like a real 500, so the original exception in the chain decides.
    """
    chain = _exception_chain(exc)
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        return _Failure.MALFORMED
    if isinstance(exc, UpstreamError):
        return _Failure.MALFORMED
    if any(
        isinstance(e, openai.APIConnectionError | TimeoutError | ConnectionError) for e in chain
    ):
        return _Failure.TRANSIENT
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status == 429 or status >= 500):
        return _Failure.TRANSIENT
    return _Failure.REJECTED


# Statuses that fault the request's content; 401, 403 and 404 fault the deployment's key or
# model name instead (the operator's to fix).
_INVALID_REQUEST = frozenset({400, 413, 422})


def _refused_as_invalid(exc: BaseException) -> bool:
    status = getattr(exc, "status_code", None)
    return _classify(exc) is _Failure.REJECTED and status in _INVALID_REQUEST


def _is_transient(exc: BaseException) -> bool:
    return _classify(exc) is _Failure.TRANSIENT


def _verdict(exc: BaseException) -> bool | None:
    """A failed call's verdict on the model: none when the request itself was refused."""
    return None if _classify(exc) is _Failure.REJECTED else False


def _retry_after(cooling: list[_Deployment], tenant: str) -> int:
    # Retry-After is whole seconds; a half-open model (0 s left) is busy with its probe
    return max(1, math.ceil(min(d.breaker.seconds_left(tenant) for d in cooling)))


# What a failed attempt may raise; anything else is a bug and propagates untouched.
_CALL_ERRORS = (openai.APIError, TimeoutError, UpstreamError, openai_http.WireError)


def _to_wire(message: Message) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments_text(call)},
            }
            for call in message.tool_calls
        ]
    return wire


def _arguments_text(call: ToolCall) -> str:
    """A tool call's arguments as the model wrote them, when known."""
    return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


def _parse_tool_call(raw: Any) -> ToolCall:
    """A tool call; arguments that are not a JSON object are the model's mistake, not the
    upstream's: the call comes back with `error` set so the caller can tell the model."""
    name = str(raw.function.name or "")
    text = str(raw.function.arguments or "")
    try:
        arguments = json.loads(text or "{}")
    except (ValueError, RecursionError):  # not JSON, over 4,300 digits, nested too deeply
        return ToolCall(raw.id, name, {}, error="invalid JSON", raw_arguments=text)
    if not isinstance(arguments, dict):
        return ToolCall(raw.id, name, {}, error="not a JSON object", raw_arguments=text)
    return ToolCall(id=raw.id, name=name, arguments=arguments, raw_arguments=text)


def _estimate_usage(model: str, messages: list[dict[str, Any]], text: str) -> tuple[int, int]:
    prompt = litellm.token_counter(model=model, messages=messages)
    completion = litellm.token_counter(model=model, text=text) if text else 0
    return prompt, completion


def _upstream_sent_usage(chunks: CustomStreamWrapper) -> bool:
    """Whether the upstream itself reported usage on this stream.

    litellm always appends a usage chunk of its own when one was requested, estimating it when
    the upstream sent none, and strips the upstream's usage chunk from what it yields; only its
    record of raw chunks tells the two apart.
    """
    return any(getattr(c, "usage", None) is not None for c in getattr(chunks, "chunks", ()))


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
        litellm. The tenant a call is for is `calling_tenant`'s."""
        self._on_cooldown = on_cooldown
        self._on_tenant_cooldowns = on_tenant_cooldowns
        self._chains: dict[Tier, tuple[_Deployment, ...]] = {
            "small": _chain(small, clock, lean_http, functools.partial(self._flipped, "small")),
            "large": _chain(large, clock, lean_http, functools.partial(self._flipped, "large")),
        }
        self._http = openai_http.OpenAIHttp()
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

        The first `acompletion` in a process takes 130-530 ms. A mocked call per model exercises
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
                _estimate_usage(deployment.model, WARM_UP_MESSAGES, "ok")

    async def complete(
        self,
        tier: Tier,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        route: str = "",  # the gateway labels metrics by route; nothing to do here
        options: GenerationOptions = NO_OPTIONS,
    ) -> Completion:
        wire = [_to_wire(m) for m in messages]

        async def attempt(deployment: _Deployment) -> Completion:
            if deployment.lean:
                body = _wire_body(deployment, wire, max_tokens, options)
                if tools is not None:
                    body["tools"] = tools
                async with asyncio.timeout(deployment.config.timeout_s):
                    answer = await self._http.complete(
                        deployment.config.api_base,
                        deployment.api_key,
                        body,
                        deployment.config.timeout_s,
                    )
                return _completion_from_json(tier, deployment, wire, answer)
            args = self._call_args(deployment, wire, max_tokens, options)
            if tools is not None:
                args["tools"] = tools
            # the SDK timeout bounds each socket operation; this bounds the whole call
            async with asyncio.timeout(deployment.config.timeout_s):
                response = await litellm.acompletion(**args)
            if not isinstance(response, ModelResponse):
                raise UpstreamError("llm", f"{deployment.model}: unexpected {type(response)}")
            return self._to_completion(tier, deployment, wire, response)

        lease, completion = await self._first_that_answers(tier, attempt)
        lease.settle(True)
        return completion

    async def stream(
        self,
        tier: Tier,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        route: str = "",
        options: GenerationOptions = NO_OPTIONS,
    ) -> AsyncIterator[StreamDelta]:
        wire = [_to_wire(m) for m in messages]

        async def attempt(deployment: _Deployment) -> _OpenStream:
            if deployment.lean:
                return await self._open_lean_stream(deployment, wire, max_tokens, options)
            async with asyncio.timeout(deployment.config.timeout_s):
                chunks = await litellm.acompletion(
                    **self._call_args(deployment, wire, max_tokens, options),
                    stream=True,
                    stream_options={"include_usage": True},
                )
                if not isinstance(chunks, CustomStreamWrapper):
                    raise UpstreamError("llm", f"{deployment.model}: unexpected {type(chunks)}")
                # the first chunk comes within the retried attempt: a stream that dies before
                # saying anything can still be retried or fall back
                try:
                    first = await anext(aiter(chunks), None)
                except BaseException:
                    await chunks.aclose()  # don't leave the connection to the garbage collector
                    raise
            if first is None:
                raise UpstreamError("llm", f"{deployment.model}: empty stream")
            return _OpenStream(deployment, chunks, first)

        lease, opened = await self._first_that_answers(tier, attempt)
        relay = _relay_lean if isinstance(opened.chunks, openai_http.SseStream) else self._relay
        try:
            async for delta in relay(opened, wire):
                if delta.done:
                    # now, not on exit: a consumer that never closes us must not hold a probe slot
                    lease.settle(True)
                yield delta
        except _CALL_ERRORS as exc:
            lease.settle(_verdict(exc))  # a stream cut after its first chunk counts too
            raise
        finally:
            lease.settle(None)  # stopped early or cancelled: no verdict (no-op once settled)
            # releases the connection when the consumer stops early
            await opened.chunks.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        # litellm caches its HTTP clients process-wide (the gateway holds one LiteLLMTiers). It
        # leaves closed clients in that cache and would hand them to the next instance, which
        # then fails with "client has been closed": flush it too.
        await close_litellm_async_clients()  # type: ignore[no-untyped-call]  # untyped upstream
        litellm.in_memory_llm_clients_cache.flush_cache()  # type: ignore[no-untyped-call]

    async def _open_lean_stream(
        self,
        deployment: _Deployment,
        wire: list[dict[str, Any]],
        max_tokens: int | None,
        options: GenerationOptions,
    ) -> _OpenStream:
        body = _wire_body(deployment, wire, max_tokens, options)
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        config = deployment.config
        async with asyncio.timeout(config.timeout_s):
            chunks = await self._http.stream(
                config.api_base, deployment.api_key, body, config.timeout_s
            )
            # as on litellm's path: the first chunk within the retried attempt
            try:
                first = await anext(aiter(chunks), None)
            except BaseException:
                await chunks.aclose()
                raise
        if first is None:
            await chunks.aclose()
            raise UpstreamError("llm", f"{deployment.model}: empty stream")
        return _OpenStream(deployment, chunks, first)

    def _call_args(
        self,
        deployment: _Deployment,
        wire: list[dict[str, Any]],
        max_tokens: int | None,
        options: GenerationOptions,
    ) -> dict[str, Any]:
        config = deployment.config
        return {
            "model": config.model,
            "messages": wire,
            "api_base": config.api_base,
            "api_key": deployment.api_key,
            "timeout": config.timeout_s,
            **_generation(deployment, max_tokens, options),
            "max_retries": 0,  # _retrying is the one retry layer
        }

    async def _first_that_answers(
        self, tier: Tier, attempt: Callable[[_Deployment], Awaitable[T]]
    ) -> tuple[_Lease, T]:
        """The first answer along the chain, skipping cooling models; the caller settles the lease
        once the answer is used up (a stream can still fail after its first chunk)."""
        chain = self._chains[tier]
        if not chain:
            raise BackendUnavailable("llm", f"no model configured for tier {tier!r}")
        tenant = calling_tenant.get()
        failures: list[tuple[str, BaseException]] = []
        cooling: list[_Deployment] = []
        for deployment in chain:
            admitted = deployment.breaker.admit(tenant)
            if admitted is None:
                cooling.append(deployment)
                continue
            lease = _Lease(deployment, admitted)
            try:
                # a probe is not retried: it only has to tell whether the model is back, and the
                # request it rides on should reach a fallback without the backoff
                attempts = 1 if admitted.is_probe else deployment.config.retries + 1
                return lease, await self._retrying(deployment, attempt, attempts)
            except _CALL_ERRORS as exc:
                log.warning("llm %s failed (%s): %s", deployment.name, _classify(exc).value, exc)
                failures.append((deployment.name, exc))
                lease.settle(_verdict(exc))
            except BaseException:
                lease.settle(None)  # cancelled: no verdict, but free a probe slot
                raise
        raise self._exhausted(tier, failures, cooling, tenant)

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
        deployment: _Deployment,
        attempt: Callable[[_Deployment], Awaitable[T]],
        attempts: int,
    ) -> T:
        """`attempt` until it answers, a failure is not transient, or `attempts` ran out, with
        exponential backoff and jitter between tries (tenacity's `wait_exponential_jitter`
        formula; a loop rather than a tenacity object per call, which cost ~5% of a
        pass-through request's CPU)."""
        for number in range(1, attempts + 1):
            try:
                return await attempt(deployment)
            except Exception as exc:
                if number >= attempts or not _is_transient(exc):
                    raise
            initial = self._backoff_initial_s
            backoff = initial * 2 ** (number - 1) + random.uniform(0, initial)
            await asyncio.sleep(min(backoff, self._backoff_max_s))
        raise ValueError(f"attempts must be at least 1, not {attempts}")

    @staticmethod
    def _exhausted(
        tier: Tier,
        failures: list[tuple[str, BaseException]],
        cooling: list[_Deployment],
        tenant: str,
    ) -> Exception:
        if not failures:
            return BackendUnavailable(
                "llm",
                f"tier {tier!r} is cooling down: all its models failed recently",
                retry_after_s=_retry_after(cooling, tenant),
            )
        detail = f"tier {tier!r}: " + "; ".join(
            [f"{name}: {_classify(exc).value}" for name, exc in failures]
            + [f"{d.name}: cooling down" for d in cooling]
        )
        if cooling:
            return BackendUnavailable("llm", detail, retry_after_s=_retry_after(cooling, tenant))
        if any(_is_transient(exc) for _, exc in failures):
            return BackendUnavailable("llm", detail)
        if all(_refused_as_invalid(exc) for _, exc in failures):
            return UpstreamRefused("llm", detail)
        return UpstreamError("llm", detail)

    @staticmethod
    def _to_completion(
        tier: Tier, deployment: _Deployment, wire: list[dict[str, Any]], response: ModelResponse
    ) -> Completion:
        if not response.choices:
            raise UpstreamError("llm", f"{deployment.model}: response without choices")
        choice = response.choices[0]
        message = choice.message
        return _completion(
            tier,
            deployment,
            wire,
            message.content or "",
            (response.usage.prompt_tokens, response.usage.completion_tokens),
            tuple(_parse_tool_call(c) for c in message.tool_calls or ()),
            choice.finish_reason,
        )

    @staticmethod
    async def _relay(opened: _OpenStream, wire: list[dict[str, Any]]) -> AsyncIterator[StreamDelta]:
        """Deltas as they come, then one final delta with usage and cost."""
        deployment = opened.deployment
        parts: list[str] = []
        calls: dict[int, dict[str, str]] = {}  # streamed tool calls by index, pieces joined
        finish_reason = ""
        reported: tuple[int, int] | None = None
        try:
            async for chunk in _prepend(opened.first, opened.chunks):
                if chunk.choices:
                    finish_reason = chunk.choices[0].finish_reason or finish_reason
                    _gather_tool_calls(calls, chunk.choices[0].delta)
                    if text := chunk.choices[0].delta.content:
                        parts.append(text)
                        yield StreamDelta(text=text, model=deployment.model)
                if (usage := getattr(chunk, "usage", None)) is not None:
                    reported = (usage.prompt_tokens, usage.completion_tokens)
        except _CALL_ERRORS as exc:
            # text has already gone out: no retry or fallback can make this answer whole
            raise UpstreamError("llm", f"{deployment.model}: stream interrupted: {exc}") from exc
        estimated = reported is None or not _upstream_sent_usage(opened.chunks)
        if reported is None or estimated:
            reported = _estimate_usage(deployment.model, wire, "".join(parts))
        yield StreamDelta(
            done=True,
            usage=deployment.cost(*reported),
            model=deployment.model,
            extra={
                "finish_reason": finish_reason,
                # False: the body ended with no finish_reason (a stream cut at a clean boundary)
                "ended": bool(finish_reason),
                "usage_estimated": estimated,
                # only when the model called tools (the client's, on the direct route)
                **(
                    {"tool_calls": tuple(_streamed_tool_call(calls[i]) for i in sorted(calls))}
                    if calls
                    else {}
                ),
            },
        )


def _gather_tool_calls(calls: dict[int, dict[str, str]], delta: Any) -> None:
    """Join a stream's tool-call pieces: id and name come first, the arguments in fragments."""
    for piece in getattr(delta, "tool_calls", None) or ():
        call = calls.setdefault(int(piece.index or 0), {"id": "", "name": "", "arguments": ""})
        call["id"] = piece.id or call["id"]
        if piece.function is not None:
            call["name"] = piece.function.name or call["name"]
            call["arguments"] += piece.function.arguments or ""


def _streamed_tool_call(call: dict[str, str]) -> ToolCall:
    function = SimpleNamespace(name=call["name"], arguments=call["arguments"])
    return _parse_tool_call(SimpleNamespace(id=call["id"], function=function))


async def _prepend(first: Any, rest: AsyncIterable[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


# -- the lean wire's bodies (OpenAI-compatible upstreams) -------------------------------------


def _wire_body(
    deployment: _Deployment,
    wire: list[dict[str, Any]],
    max_tokens: int | None,
    options: GenerationOptions,
) -> dict[str, Any]:
    """The request litellm would send an OpenAI-compatible server for `_call_args`."""
    return {
        "model": deployment.config.model.removeprefix(openai_http.PREFIX),
        "messages": wire,
        **_generation(deployment, max_tokens, options),
    }


def _generation(
    deployment: _Deployment, max_tokens: int | None, options: GenerationOptions
) -> dict[str, Any]:
    """The sampling parameters both wires send: the client's over the tier's (no litellm
    drop_params: a parameter an upstream refuses is refused, never dropped)."""
    config = deployment.config
    return {
        "temperature": config.temperature,
        **options.wire(),
        "max_tokens": options.cap(max_tokens or config.max_tokens),
    }


def _completion_from_json(
    tier: Tier, deployment: _Deployment, wire: list[dict[str, Any]], answer: dict[str, Any]
) -> Completion:
    """`_to_completion` for a decoded OpenAI answer."""
    choices = answer.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise UpstreamError("llm", f"{deployment.model}: response without choices")
    choice = choices[0]
    try:
        message = choice.get("message") or {}
        text = _text(message)
        tokens = _usage_tokens(answer.get("usage") or {})
        calls = tuple(_parse_tool_call(_json_call(c)) for c in _listed(message, "tool_calls"))
    except _ODD_SHAPE as exc:
        raise _odd_shape(deployment, "response", exc) from exc
    return _completion(tier, deployment, wire, text, tokens, calls, choice.get("finish_reason"))


# What reading valid JSON of a shape no OpenAI answer has raises (a message that is a string,
# tokens that are words): the model's failure, like a body that is not JSON.
_ODD_SHAPE = (AttributeError, TypeError, ValueError, KeyError)


def _odd_shape(deployment: _Deployment, what: str, exc: Exception) -> UpstreamError:
    return UpstreamError("llm", f"{deployment.model}: {what} of an odd shape: {exc}")


def _usage_tokens(usage: dict[str, Any]) -> tuple[int, int]:
    counts = (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
    if not all(isinstance(n, int | float) and n >= 0 for n in counts):
        raise ValueError(f"usage {counts!r:.60}")
    return int(counts[0]), int(counts[1])


def _text(message: dict[str, Any]) -> str:
    text = message.get("content") or ""
    if not isinstance(text, str):
        raise TypeError(f"content is {type(text).__name__}")
    return text


def _listed(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key) or []
    if not isinstance(value, list):
        raise TypeError(f"{key} is {type(value).__name__}")
    return value


def _completion(
    tier: Tier,
    deployment: _Deployment,
    wire: list[dict[str, Any]],
    text: str,
    tokens: tuple[int, int],
    tool_calls: tuple[ToolCall, ...],
    finish_reason: str | None,
) -> Completion:
    """One answer, whichever wire brought it. An upstream that sent no usage (zeros) is
    estimated: a real prompt is never free, so the call is not booked at no cost."""
    estimated = tokens[0] == 0
    if estimated:
        log.warning("llm %s sent no usage; estimating tokens", deployment.model)
        tokens = _estimate_usage(deployment.model, wire, text)
    return Completion(
        text=text,
        tier=tier,
        model=deployment.model,
        usage=deployment.cost(*tokens),
        tool_calls=tool_calls,
        finish_reason=finish_reason or "stop",
        usage_estimated=estimated,
    )


def _json_call(raw: dict[str, Any]) -> SimpleNamespace:
    function = raw.get("function") or {}
    return SimpleNamespace(
        id=raw.get("id") or "",
        function=SimpleNamespace(name=function.get("name"), arguments=function.get("arguments")),
    )


def _gather_lean_tool_calls(calls: dict[int, dict[str, str]], delta: dict[str, Any]) -> None:
    """A decoded delta's tool-call pieces joined into `calls` (by index)."""
    for piece in _listed(delta, "tool_calls"):
        call = calls.setdefault(
            int(piece.get("index") or 0), {"id": "", "name": "", "arguments": ""}
        )
        call["id"] = piece.get("id") or call["id"]
        if (function := piece.get("function")) is not None:
            call["name"] = function.get("name") or call["name"]
            call["arguments"] += function.get("arguments") or ""


async def _relay_lean(
    opened: _OpenStream, wire: list[dict[str, Any]]
) -> AsyncIterator[StreamDelta]:
    """`LiteLLMTiers._relay` for the lean wire's batches of decoded OpenAI chunks."""
    deployment = opened.deployment
    parts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish_reason = ""
    reported: tuple[int, int] | None = None
    try:
        async for batch in _prepend(opened.first, opened.chunks):
            texts: list[str] = []
            try:  # one try a batch: free on the hot path, unlike a context manager a chunk
                for chunk in batch:
                    if choices := _listed(chunk, "choices"):
                        finish_reason = choices[0].get("finish_reason") or finish_reason
                        delta = choices[0].get("delta") or {}
                        _gather_lean_tool_calls(calls, delta)
                        if text := _text(delta):
                            texts.append(text)
                    if (usage := chunk.get("usage")) is not None:
                        reported = _usage_tokens(usage)
            except _ODD_SHAPE as exc:
                raise _odd_shape(deployment, "stream chunk", exc) from exc
            if texts:
                # the chunks that arrived together go on as one delta: one event to the client
                text = "".join(texts)
                parts.append(text)
                yield StreamDelta(text=text, model=deployment.model)
    except _CALL_ERRORS as exc:
        raise UpstreamError("llm", f"{deployment.model}: stream interrupted: {exc}") from exc
    estimated = reported is None
    if reported is None:
        reported = _estimate_usage(deployment.model, wire, "".join(parts))
    yield StreamDelta(
        done=True,
        usage=deployment.cost(*reported),
        model=deployment.model,
        extra={
            "finish_reason": finish_reason,
            # False: neither a finish_reason nor `data: [DONE]` came (the body just stopped)
            "ended": bool(finish_reason) or getattr(opened.chunks, "ended", False),
            "usage_estimated": estimated,
            **(
                {"tool_calls": tuple(_streamed_tool_call(calls[i]) for i in sorted(calls))}
                if calls
                else {}
            ),
        },
    )
