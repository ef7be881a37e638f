"""The remote reranker: any `/rerank` API through litellm's `arerank`.

It is an upstream the gateway pays for, handled as a model tier's models are: transient
failures (connection errors, timeouts, 429, 5xx) retried with the tiers' backoff
(`backends.llm.retrying`), a circuit breaker per tenant and a shared one
(`backends.llm.breakers.ModelBreaker`: one tenant's failures never take the reranker from the
others), and each answered call priced from its `meta.billed_units` and reported to the
request's `on_cost`. The whole call, retries and backoff included, ends by the request's
`deadline`; an attempt also by `timeout_s`. Whatever fails surfaces as the seam's
`BackendUnavailable` (or `UpstreamError` for an answer of the wrong shape), and the caller
keeps the fused order.
"""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import asyncio
import logging
import math
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import litellm

from backends.errors import BackendUnavailable, UpstreamError
from backends.llm.breakers import ModelBreaker
from backends.llm.deployments import resolve_api_key
from backends.llm.failures import CALL_ERRORS, classify, is_transient, verdict
from backends.llm.retrying import retrying
from backends.rerank.base import RerankerKind, RerankRequest
from backends.rerank.config import RemoteRerankConfig

log = logging.getLogger(__name__)

# litellm prints a "Give Feedback / Get Help" banner to stdout on every exception.
litellm.suppress_debug_info = True

BACKEND = "rerank"


class RemoteReranker:
    kind: RerankerKind = "remote"

    def __init__(
        self,
        config: RemoteRerankConfig,
        *,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_id = config.model
        self._config = config
        self._api_key = resolve_api_key(config.model, config.api_key_env)
        self._breaker = ModelBreaker(config.cooldown_after, config.cooldown_s, clock, self._flip)
        self._backoff = (backoff_initial_s, backoff_max_s)

    async def scores(self, request: RerankRequest) -> list[float]:
        if not request.passages:
            return []
        admitted = self._breaker.admit(request.tenant)
        if admitted is None:
            wait = self._breaker.seconds_left(request.tenant)
            raise BackendUnavailable(
                BACKEND,
                f"{self.model_id} is cooling down: its calls failed recently",
                retry_after_s=max(1, math.ceil(wait)),
            )
        # A probe is not retried: it only has to tell whether the reranker is back.
        attempts = 1 if admitted.is_probe else self._config.retries + 1
        try:
            async with asyncio.timeout_at(_loop_time(request.deadline)):
                response = await retrying(lambda: self._call(request), attempts, *self._backoff)
            result = _scores(response, len(request.passages), self.model_id)
        except CALL_ERRORS as exc:
            self._breaker.record(admitted, verdict(exc))
            raise _failure(self.model_id, exc) from exc
        except BaseException:
            self._breaker.record(admitted, None)  # cancelled: no verdict, but free a probe
            raise
        self._breaker.record(admitted, True)
        if request.on_cost is not None:
            request.on_cost(self._price(response))
        return result

    async def _call(self, request: RerankRequest) -> Any:
        timeout = self._config.timeout_s
        if request.deadline is not None:
            timeout = min(timeout, max(request.deadline - time.monotonic(), 0.001))
        return await litellm.arerank(
            model=self._config.model,
            query=request.query,
            documents=list(request.passages),
            api_base=self._config.api_base,
            api_key=self._api_key,
            timeout=timeout,
            return_documents=False,
        )

    async def warm_up(self) -> None:
        """Run litellm's lazy rerank setup (provider config, HTTP client, error mapping) now,
        not in the first request's `timeout_s`: one call to a local port that refuses at once,
        so the upstream is neither called nor billed, whether or not it is up yet."""
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
            port = closed.getsockname()[1]
            try:
                await litellm.arerank(
                    model=self._config.model,
                    query="warm-up",
                    documents=["warm-up"],
                    api_base=f"http://127.0.0.1:{port}/v1/rerank",
                    api_key=self._api_key,
                    timeout=1.0,
                )
            except Exception:  # refused, as meant
                log.debug("reranker warm-up call refused, as meant", exc_info=True)

    def _price(self, response: Any) -> float:
        billed = _billed_units(response)
        units = billed.get("search_units")
        tokens = billed.get("total_tokens") or billed.get("input_tokens") or 0
        searches = units if isinstance(units, int | float) else 1
        return (
            searches * self._config.cost_per_search_unit_usd
            + float(tokens) * self._config.cost_per_token_usd
        )

    def _flip(self, tenant: str | None, is_open: bool) -> None:
        # The tenant is named in the log only, never in a metric label.
        whom = "every tenant" if tenant is None else f"tenant {tenant!r} alone"
        if is_open:
            log.warning(
                "reranker %s cooling down for %s for %.1f s",
                self.model_id,
                whom,
                self._config.cooldown_s,
            )
        else:
            log.info("reranker %s answers again for %s", self.model_id, whom)

    async def aclose(self) -> None:
        """Nothing to release: litellm's shared HTTP clients are closed by the LLM backend."""


def _loop_time(deadline: float | None) -> float | None:
    """`deadline` (a `time.monotonic()` instant) on the running loop's clock."""
    if deadline is None:
        return None
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())


def _scores(response: Any, expected: int, model: str) -> list[float]:
    """One score per passage, in the passages' order, from the `results` (index, score)."""
    results = getattr(response, "results", None)
    if not isinstance(results, list) or len(results) != expected:
        raise UpstreamError(BACKEND, f"{model}: expected {expected} results, got {results!r:.80}")
    scores: dict[int, float] = {}
    for item in results:
        index = item.get("index") if isinstance(item, Mapping) else None
        score = item.get("relevance_score") if isinstance(item, Mapping) else None
        if not isinstance(index, int) or not 0 <= index < expected or index in scores:
            raise UpstreamError(BACKEND, f"{model}: a result of the wrong index: {item!r:.80}")
        if not isinstance(score, int | float) or not math.isfinite(score):
            raise UpstreamError(BACKEND, f"{model}: a result of the wrong score: {item!r:.80}")
        scores[index] = float(score)
    return [scores[i] for i in range(expected)]


def _billed_units(response: Any) -> Mapping[str, Any]:
    meta = getattr(response, "meta", None)
    billed = meta.get("billed_units") if isinstance(meta, Mapping) else None
    return billed if isinstance(billed, Mapping) else {}


def _failure(model: str, exc: BaseException) -> Exception:
    """What a call whose attempts all failed raises: unavailable if trying later may help."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, TimeoutError):
        return BackendUnavailable(BACKEND, f"{model}: no answer by the deadline")
    kind = f"{model}: {classify(exc).value} ({type(exc).__name__})"
    return BackendUnavailable(BACKEND, kind) if is_transient(exc) else UpstreamError(BACKEND, kind)
