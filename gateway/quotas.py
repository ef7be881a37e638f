"""Per-tenant request rate limits and daily spend budgets: the decisions, and what a refusal is.

Limits come from each tenant's config (`rate_limit`, `daily_budget_usd`); the counters live in
a `QuotaStore`: Redis, shared by every replica, or this process's memory when no Redis is
configured (then every process enforces the same limits on its own).

- The rate limit is taken once per request to any tenant endpoint, right after the key is
  checked and before the body is read, admission or any work (`gateway.limits`). Over it: 429
  `rate_limit_exceeded` with Retry-After (whole seconds until a token is back, at least 1).
- The budget is checked when an answering request arrives (so a stream refused before it
  starts is a plain 429, and a spent tenant costs nothing, cache hits included) and before
  every model call (`BudgetedLLM`); each call's cost is added after it. Spent: 429
  `budget_exceeded` naming the budget, with Retry-After until 00:00 UTC. Never a cheaper tier.
  Calls already running when the budget runs out finish, so a day's spend can pass the budget
  by at most the calls in flight at that moment. An agent loop that finds its budget spent at
  its next turn stops there with that 429: its earlier turns are recorded, no partial answer.

Redis down, slow or answering garbage: every decision falls back to this process's own
counters at once (`querygate_quota_local_decisions_total`, `querygate_quota_store_degraded`,
one warning per outage), and Redis is asked again every `quotas.redis_retry_s` until it
answers. Meanwhile each process enforces the rate limit alone (a fleet of N admits up to N
times the rate and burst) and the budget from the last total it read plus its own spend since
(the fleet can pass the budget by up to N-1 times what was left). Spend recorded during the
outage is added to Redis when it is back, so the day's total there stays right. Failing open
keeps answering through a Redis outage; the overshoot is bounded by the outage's length and
the fleet's size, which we judge better than refusing every tenant's paid traffic.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from backends.errors import BackendError
from backends.llm.base import (
    LLM,
    NO_OPTIONS,
    Completion,
    GenerationOptions,
    Message,
    StreamDelta,
    Tier,
)
from backends.quotas.base import QuotaStore
from backends.quotas.memory import MemoryQuotaStore
from gateway.errors import TooManyRequests
from gateway.metrics import Metrics
from gateway.settings import TenantConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

# The tenant whose request is being served: set by the limits middleware, read before and
# after every model call. None outside a request (the CLI, benchmarks): no budget applies.
current_tenant: ContextVar[TenantConfig | None] = ContextVar("quota_tenant", default=None)


class RateLimited(TooManyRequests):
    type = "rate_limit_exceeded"
    outcome = "rate_limited"


class BudgetExceeded(TooManyRequests):
    type = "budget_exceeded"
    outcome = "budget_exceeded"


def utc_day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")


def seconds_to_midnight(now: float) -> int:
    """Whole seconds until the next UTC day begins, at least 1."""
    return max(1, math.ceil(86_400 - now % 86_400))


def retry_after(wait_s: float) -> int:
    """Retry-After in whole seconds, never 0: a client told 0 retries at once and is refused."""
    return max(1, math.ceil(wait_s))


class Quotas:
    """One per process. `shared` is the Redis store (None: the limits are per process)."""

    def __init__(
        self,
        shared: QuotaStore | None,
        metrics: Metrics,
        *,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shared = shared
        self._local = MemoryQuotaStore(monotonic)
        self._metrics = metrics
        self._retry_s = retry_s
        self._clock = clock
        self._monotonic = monotonic
        self._retry_at = 0.0  # monotonic time before which the shared store is not asked
        self.degraded = False
        # Budgets while the shared store is down: the last total it gave, plus spend not yet
        # added to it (replayed when it is back).
        self._last_seen: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], float] = {}
        metrics.quota_store_degraded.set(0)

    @property
    def store_name(self) -> str:
        return self._shared.name if self._shared is not None else self._local.name

    # -- the checks -----------------------------------------------------------------------

    async def admit(self, tenant: TenantConfig, *, answering: bool) -> None:
        """A request has arrived: its tenant's rate limit, then (for an endpoint that answers
        with a model) its budget. Raises RateLimited or BudgetExceeded."""
        limit = tenant.rate_limit
        if limit is not None:
            wait = await self._take(tenant.id, limit.requests_per_s, limit.burst)
            if wait > 0:
                self._metrics.quota_refusals.labels("rate_limit").inc()
                seconds = retry_after(wait)
                raise RateLimited(
                    f"tenant {tenant.id} is over its rate limit of {limit.requests_per_s:g} "
                    f"requests/s (burst {limit.burst}); retry in {seconds} s",
                    retry_after_s=seconds,
                )
        if answering:
            await self.check_budget(tenant)

    async def check_budget(self, tenant: TenantConfig) -> None:
        budget = tenant.daily_budget_usd
        if budget is None:
            return
        now = self._clock()
        day = utc_day(now)
        spent = await self._spent(tenant.id, day)
        if spent >= budget:
            self._metrics.quota_refusals.labels("budget").inc()
            raise BudgetExceeded(
                f"tenant {tenant.id} has spent its daily budget of ${budget:g} "
                f"(daily_budget_usd) for {day} UTC; it resets at 00:00 UTC",
                retry_after_s=seconds_to_midnight(now),
            )

    async def record_spend(self, tenant: TenantConfig, usd: float) -> None:
        """Add one model call's cost to the tenant's day. Never raises: a store that fails
        keeps the amount here and adds it when it is back."""
        if not usd > 0:
            return
        day = utc_day(self._clock())
        if self._shared is None:
            await self._local.add_spend(tenant.id, day, usd)
            return
        key = (tenant.id, day)
        self._pending[key] = self._pending.get(key, 0.0) + usd
        await self._flush()

    async def aclose(self) -> None:
        await self._local.aclose()

    # -- the shared store, and the fallback -----------------------------------------------

    async def _take(self, tenant: str, rate: float, burst: int) -> float:
        if self._shared is not None:
            shared = self._shared
            wait = await self._ask(lambda: shared.take(tenant, rate, burst))
            if wait is not None:
                return wait
            self._metrics.quota_local_decisions.labels("rate_limit").inc()
        return await self._local.take(tenant, rate, burst)

    async def _spent(self, tenant: str, day: str) -> float:
        if self._shared is None:
            return await self._local.spent(tenant, day)
        shared, key = self._shared, (tenant, day)
        await self._flush()
        total = await self._ask(lambda: shared.spent(tenant, day))
        if total is None:
            self._metrics.quota_local_decisions.labels("budget").inc()
            total = self._last_seen.get(key, 0.0)
        else:
            self._seen(key, total)
        return total + self._pending.get(key, 0.0)

    async def _flush(self) -> None:
        """Add the spend not yet in the shared store to it. Each amount is taken out before
        the await, so two requests never add the same amount twice."""
        assert self._shared is not None
        shared = self._shared
        for key in list(self._pending):
            usd = self._pending.pop(key, 0.0)
            if usd <= 0:
                continue
            tenant, day = key
            total = await self._ask(lambda: shared.add_spend(tenant, day, usd))  # noqa: B023
            if total is None:
                self._pending[key] = self._pending.get(key, 0.0) + usd
                self._metrics.quota_local_decisions.labels("spend").inc()
                return
            self._seen(key, total)

    def _seen(self, key: tuple[str, str], total: float) -> None:
        if key not in self._last_seen and self._last_seen:
            # A new (tenant, day): drop totals of days that are over.
            self._last_seen = {k: v for k, v in self._last_seen.items() if k[1] >= key[1]}
        self._last_seen[key] = max(total, self._last_seen.get(key, 0.0))

    async def _ask(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """The shared store's answer, or None: it failed now, or failed within the last
        `retry_s` (then it is not asked, so an outage costs one timeout per interval)."""
        if self._monotonic() < self._retry_at:
            return None
        try:
            result = await call()
        except BackendError as exc:
            self._retry_at = self._monotonic() + self._retry_s
            if not self.degraded:
                self.degraded = True
                self._metrics.quota_store_degraded.set(1)
                log.warning(
                    "quota store unavailable: rate limits and budgets are enforced per "
                    "process until it is back",
                    extra={"store": self.store_name, "error": str(exc)},
                )
            return None
        if self.degraded:
            self.degraded = False
            self._metrics.quota_store_degraded.set(0)
            log.warning("quota store back: rate limits and budgets are shared again")
        return result


class BudgetedLLM:
    """The LLM seam with the current request's tenant's budget around every call: checked
    before it (BudgetExceeded), its cost recorded after it. Built once per process around the
    tiers, so every model call of every stage and route (rewrite, agent turns, final answers,
    streams) passes through it. A call outside a request (no tenant) is not budgeted. A stream
    that fails before its last delta records nothing: its usage never arrived."""

    def __init__(self, inner: LLM, quotas: Quotas) -> None:
        self._inner = inner
        self._quotas = quotas

    def has_tier(self, tier: Tier) -> bool:
        return self._inner.has_tier(tier)

    def prices(self, tier: Tier) -> tuple[float, float]:
        return self._inner.prices(tier)

    async def complete(
        self,
        tier: Tier,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        route: str = "",
        options: GenerationOptions = NO_OPTIONS,
    ) -> Completion:
        tenant = current_tenant.get()
        if tenant is not None:
            await self._quotas.check_budget(tenant)
        completion = await self._inner.complete(
            tier, messages, tools=tools, max_tokens=max_tokens, route=route, options=options
        )
        if tenant is not None:
            await self._record(tenant, completion.usage.cost_usd)
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
        tenant = current_tenant.get()
        if tenant is not None:
            await self._quotas.check_budget(tenant)
        stream = self._inner.stream(
            tier, messages, max_tokens=max_tokens, route=route, options=options
        )
        async for delta in stream:
            if delta.done and tenant is not None and delta.usage is not None:
                await self._record(tenant, delta.usage.cost_usd)
            yield delta

    async def warm_up(self) -> None:
        await self._inner.warm_up()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def _record(self, tenant: TenantConfig, usd: float) -> None:
        # Shielded: a client that hangs up now must not erase a call that was paid for.
        await asyncio.shield(self._quotas.record_spend(tenant, usd))
