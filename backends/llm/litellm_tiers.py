"""The LLM seam over `litellm.acompletion`: small/large tiers, retries, fallbacks, exact cost.

One retry layer only: the OpenAI SDK inside litellm is told `max_retries=0` and tenacity retries
transient failures (connection errors, timeouts, 429, 5xx) with bounded exponential backoff,
`retries` times per model. Then the tier's `fallbacks` are tried in order. Failures that a retry
cannot fix (4xx other than 429, a malformed body) are not retried but do move on to the next
fallback, which may be another provider or deployment. When every model failed,
`BackendUnavailable` is raised if any of them failed transiently (trying later may help), else
`UpstreamError`.

Cost is ours, not litellm's: `response_cost` is None for unregistered models, so cost is the
tier's per-token prices times the usage the upstream reported. On streams a usage chunk is
requested; when the upstream sends none, usage is estimated with `litellm.token_counter` and the
final delta says so (`extra["usage_estimated"]`).

`litellm.Router` is deliberately not used: it costs 1.5-2x the CPU per call and adds its own
retry layer.
"""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import litellm
import openai
from litellm import CustomStreamWrapper, ModelResponse
from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from backends.errors import BackendUnavailable, UpstreamError
from backends.llm.base import (
    Completion,
    Message,
    StreamDelta,
    Tier,
    TierConfig,
    ToolCall,
    Usage,
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


@dataclass(frozen=True, slots=True)
class _Deployment:
    """One model of a tier's chain with its API key resolved."""

    config: TierConfig
    api_key: str

    @property
    def model(self) -> str:
        return self.config.model

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Usage:
        cost = (
            prompt_tokens * self.config.input_cost_per_token
            + completion_tokens * self.config.output_cost_per_token
        )
        return Usage(prompt_tokens, completion_tokens, cost)


@dataclass(frozen=True, slots=True)
class _OpenStream:
    """A stream whose first chunk has arrived: past this point nothing is retried."""

    deployment: _Deployment
    chunks: CustomStreamWrapper
    first: Any


def _resolve_key(config: TierConfig) -> str:
    if config.api_key_env is None:
        return KEYLESS_PLACEHOLDER
    key = os.environ.get(config.api_key_env, "")
    if not key:
        # fail at start-up, not on the first request hours later
        raise ValueError(f"{config.model}: environment variable {config.api_key_env} is not set")
    return key


def _chain(config: TierConfig | None) -> tuple[_Deployment, ...]:
    if config is None:
        return ()
    configs = (config, *config.fallbacks)
    return tuple(_Deployment(c, _resolve_key(c)) for c in configs)


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


def _is_transient(exc: BaseException) -> bool:
    return _classify(exc) is _Failure.TRANSIENT


# What a failed attempt may raise; anything else is a bug and propagates untouched.
_CALL_ERRORS = (openai.APIError, TimeoutError, UpstreamError)


def _to_wire(message: Message) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ]
    return wire


def _parse_tool_call(raw: Any) -> ToolCall:
    try:
        arguments = json.loads(raw.function.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise UpstreamError("llm", f"tool call {raw.function.name!r}: bad JSON arguments") from exc
    if not isinstance(arguments, dict):
        raise UpstreamError("llm", f"tool call {raw.function.name!r}: arguments not an object")
    return ToolCall(id=raw.id, name=raw.function.name, arguments=arguments)


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
    ) -> None:
        self._chains: dict[Tier, tuple[_Deployment, ...]] = {
            "small": _chain(small),
            "large": _chain(large),
        }
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s

    def has_tier(self, tier: Tier) -> bool:
        return bool(self._chains[tier])

    async def warm_up(self) -> None:
        """Run litellm's lazy imports and setup now rather than on the first real request.

        The first `acompletion` in a process takes 130-530 ms. A mocked call per model exercises
        the same code path without touching the upstream (no tokens billed, works while the
        upstream is still starting).
        """
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
    ) -> Completion:
        wire = [_to_wire(m) for m in messages]

        async def attempt(deployment: _Deployment) -> Completion:
            # the SDK timeout bounds each socket operation; this bounds the whole call
            async with asyncio.timeout(deployment.config.timeout_s):
                response = await litellm.acompletion(
                    **self._call_args(deployment, wire, max_tokens), tools=tools
                )
            if not isinstance(response, ModelResponse):
                raise UpstreamError("llm", f"{deployment.model}: unexpected {type(response)}")
            return self._to_completion(tier, deployment, wire, response)

        return await self._first_that_answers(tier, attempt)

    async def stream(
        self,
        tier: Tier,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        route: str = "",
    ) -> AsyncIterator[StreamDelta]:
        wire = [_to_wire(m) for m in messages]

        async def attempt(deployment: _Deployment) -> _OpenStream:
            async with asyncio.timeout(deployment.config.timeout_s):
                chunks = await litellm.acompletion(
                    **self._call_args(deployment, wire, max_tokens),
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

        opened = await self._first_that_answers(tier, attempt)
        try:
            async for delta in self._relay(opened, wire):
                yield delta
        finally:
            # releases the connection when the consumer stops early
            await opened.chunks.aclose()

    async def aclose(self) -> None:
        # litellm caches its HTTP clients process-wide (the gateway holds one LiteLLMTiers). It
        # leaves closed clients in that cache and would hand them to the next instance, which
        # then fails with "client has been closed": flush it too.
        await close_litellm_async_clients()  # type: ignore[no-untyped-call]  # untyped upstream
        litellm.in_memory_llm_clients_cache.flush_cache()  # type: ignore[no-untyped-call]

    def _call_args(
        self, deployment: _Deployment, wire: list[dict[str, Any]], max_tokens: int | None
    ) -> dict[str, Any]:
        config = deployment.config
        return {
            "model": config.model,
            "messages": wire,
            "api_base": config.api_base,
            "api_key": deployment.api_key,
            "timeout": config.timeout_s,
            "max_tokens": max_tokens or config.max_tokens,
            "temperature": config.temperature,
            "max_retries": 0,  # tenacity is the one retry layer
        }

    async def _first_that_answers(
        self, tier: Tier, attempt: Callable[[_Deployment], Awaitable[T]]
    ) -> T:
        chain = self._chains[tier]
        if not chain:
            raise BackendUnavailable("llm", f"no model configured for tier {tier!r}")
        failures: list[tuple[str, BaseException]] = []
        for deployment in chain:
            try:
                return await self._retrying(deployment, attempt)
            except _CALL_ERRORS as exc:
                log.warning("llm %s failed (%s): %s", deployment.model, _classify(exc).value, exc)
                failures.append((deployment.model, exc))
        raise self._exhausted(tier, failures)

    async def _retrying(
        self, deployment: _Deployment, attempt: Callable[[_Deployment], Awaitable[T]]
    ) -> T:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(deployment.config.retries + 1),
            wait=wait_exponential_jitter(
                multiplier=self._backoff_initial_s,
                max=self._backoff_max_s,
                jitter=self._backoff_initial_s,
            ),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        return await retrying(attempt, deployment)

    @staticmethod
    def _exhausted(tier: Tier, failures: list[tuple[str, BaseException]]) -> Exception:
        detail = f"tier {tier!r}: " + "; ".join(
            f"{model}: {_classify(exc).value}" for model, exc in failures
        )
        if any(_is_transient(exc) for _, exc in failures):
            return BackendUnavailable("llm", detail)
        return UpstreamError("llm", detail)

    @staticmethod
    def _to_completion(
        tier: Tier, deployment: _Deployment, wire: list[dict[str, Any]], response: ModelResponse
    ) -> Completion:
        if not response.choices:
            raise UpstreamError("llm", f"{deployment.model}: response without choices")
        choice = response.choices[0]
        message = choice.message
        text = message.content or ""
        tokens = (response.usage.prompt_tokens, response.usage.completion_tokens)
        if tokens[0] == 0:
            # litellm reports zeros when the upstream sent no usage; a real prompt is never
            # free, so estimate rather than book the call at no cost
            log.warning("llm %s sent no usage; estimating tokens", deployment.model)
            tokens = _estimate_usage(deployment.model, wire, text)
        return Completion(
            text=text,
            tier=tier,
            model=deployment.model,
            usage=deployment.cost(*tokens),
            tool_calls=tuple(_parse_tool_call(c) for c in message.tool_calls or ()),
            finish_reason=choice.finish_reason or "stop",
        )

    @staticmethod
    async def _relay(opened: _OpenStream, wire: list[dict[str, Any]]) -> AsyncIterator[StreamDelta]:
        """Deltas as they come, then one final delta with usage and cost."""
        deployment = opened.deployment
        parts: list[str] = []
        finish_reason = ""
        reported: tuple[int, int] | None = None
        try:
            async for chunk in _prepend(opened.first, opened.chunks):
                if chunk.choices:
                    finish_reason = chunk.choices[0].finish_reason or finish_reason
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
            extra={"finish_reason": finish_reason, "usage_estimated": estimated},
        )


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item
