"""Per-tenant request rate limits and daily spend budgets: the decisions, and what a refusal is.

Limits come from each tenant's config (`rate_limit`, `daily_budget_usd`); the counters live in
a `QuotaStore`: Redis, shared by every replica, or this process's memory when no Redis is
configured (then every process enforces the same limits on its own).

- The rate limit is taken once per request to any tenant endpoint, right after the key is
  checked and before the body is read, admission or any work (`gateway.http.middleware.limits`).
  Over it: 429
  `rate_limit_exceeded` with Retry-After (whole seconds until a token is back, at least 1).
- The budget is checked when an answering request arrives (so a stream refused before it
  starts is a plain 429, and a spent tenant costs nothing, cache hits included) and before
  every model call (`gateway.limits.budget.BudgetedLLM`); each call's cost is added after it.
  Spent: 429 `budget_exceeded` naming the budget, with Retry-After until 00:00 UTC. Never a
  cheaper tier. Calls already running when the budget runs out finish, so a day's spend can
  pass the budget by at most the calls in flight at that moment. An agent loop that finds its
  budget spent at its next turn stops there with that 429: its earlier turns are recorded, no
  partial answer. A call cut before its usage arrived (client hang-up, upstream failure after
  some text) is charged an estimate (`BudgetedLLM`), so hanging up is no way round a budget.

Redis down or slow (`BackendUnavailable`, `gateway.limits.shared_store`): every decision falls
back to this process's own counters at once (`querygate_quota_local_decisions_total`,
`querygate_quota_store_degraded`, one warning per outage), and Redis is asked again every
`quotas.redis_retry_s` until it answers, and by the health probe (`ping`), which clears the
gauge without traffic and sends the spend kept here (`gateway.limits.outbox`: each amount with
its id, not added twice). One tenant's keys holding garbage is that tenant's problem only:
logged, repaired, and that one decision made here. Meanwhile each process enforces the rate
limit alone (a fleet of N admits up to N times the rate and burst) and the budget from the last
total it read plus its own spend since (the fleet can pass the budget by up to N-1 times what
was left, N the processes that had read it). A process that never read the tenant's total for
the day (it started, or the day began, during the outage) refuses the tenant's budgeted calls
(`BudgetUnknown`, a 503 with Retry-After) until the store answers: counting from nothing would
give a spent tenant a new day's budget. Spend recorded during the outage is added to Redis when
it is back, so the day's total there stays right. Failing open keeps answering through a Redis
outage; the overshoot is bounded by the outage's length and the fleet's size, which we judge
better than refusing every tenant's paid traffic. A request's checks pass its `spend` (its Redis
time budget, `backends.redis_client`): past it a check is decided here, and the store is not
marked down.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.quotas.base import QuotaStore
from backends.quotas.memory import MemoryQuotaStore
from backends.redis_client import RequestSpend
from gateway.errors import ServiceUnavailable, TooManyRequests
from gateway.limits.outbox import SpendOutbox, Ticket
from gateway.limits.shared_store import Key, SharedStore, utc_day
from gateway.obs.metrics import MULTIPROC_ENV, Metrics
from gateway.settings import TenantConfig

# What a refusal was for (`querygate_quota_refusals`), and which checks are made per process
# while the shared store is down (`querygate_quota_local_decisions`; "spend" is the outbox's).
QUOTA_REASONS = ("rate_limit", "budget", "budget_unknown")
LOCAL_CHECKS = ("rate_limit", "budget", "spend")

log = logging.getLogger(__name__)

# How long `ping` waits for the spend kept while the store was down (well under the health
# probe's timeout); the rest is sent in the background.
FLUSH_WAIT_S = 1.0

# How long a budget check stands in for the next model call's own.
_CHECK_STANDS_S = 5.0


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    """A budget check a tenant passed: it stands for one model call to come while it is fresh
    and no spend of the tenant's was kept since (`Quotas.stands`)."""

    tenant: str
    at: float  # time.monotonic() when it was made
    spends: int  # spends of the tenant's this process had kept by then


class RateLimited(TooManyRequests):
    type = "rate_limit_exceeded"
    outcome = "rate_limited"


class BudgetExceeded(TooManyRequests):
    type = "budget_exceeded"
    outcome = "budget_exceeded"


class BudgetUnknown(ServiceUnavailable):
    """The shared store is down and never gave this process the tenant's spend for the day."""

    type = "budget_unknown"


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
        self._local = MemoryQuotaStore(monotonic)
        self._metrics = metrics
        self._clock = clock
        self._shared: SharedStore | None = None
        self._outbox: SpendOutbox | None = None
        if shared is not None:
            self._shared = SharedStore(
                shared, metrics, retry_s=retry_s, clock=clock, monotonic=monotonic
            )
            self._outbox = SpendOutbox(self._shared, metrics)
        # Spends kept per tenant (a count): a budget check stands only while it is unchanged.
        self._spends: dict[str, int] = {}
        metrics.quota_store_degraded.set(0)

    @property
    def store_name(self) -> str:
        return self._shared.name if self._shared is not None else self._local.name

    @property
    def is_shared(self) -> bool:
        """Whether the limits are kept in a shared store (which `ping` probes)."""
        return self._shared is not None

    @property
    def degraded(self) -> bool:
        """Whether the shared store is down: decisions are made in this process."""
        return self._shared is not None and self._shared.degraded

    # -- the checks -----------------------------------------------------------------------

    async def admit(
        self, tenant: TenantConfig, *, answering: bool, spend: RequestSpend | None = None
    ) -> BudgetCheck | None:
        """A request has arrived: its tenant's rate limit, then (for an endpoint that answers
        with a model) its budget. Raises RateLimited or BudgetExceeded. Both in one round trip
        to the shared store; the budget check returned then stands in for the request's first
        model call's own (`stands`), as a stream's does. `spend`: the request's."""
        limit = tenant.rate_limit
        budget = tenant.daily_budget_usd if answering else None
        if limit is None:
            return await self.check_budget(tenant, spend=spend) if answering else None
        now = self._clock()
        day = utc_day(now)
        rate, burst = limit.requests_per_s, limit.burst
        if budget is None:
            wait, spent = await self._take(tenant.id, rate, burst, spend), 0.0
        else:
            wait, spent = await self._take_and_spent(tenant.id, rate, burst, day, spend)
        if wait > 0:
            self._metrics.quota_refusals.labels("rate_limit").inc()
            seconds = retry_after(wait)
            raise RateLimited(
                f"tenant {tenant.id} is over its rate limit of {limit.requests_per_s:g} "
                f"requests/s (burst {limit.burst}); retry in {seconds} s",
                retry_after_s=seconds,
            )
        if budget is None:
            return None
        return self._judge_budget(tenant, budget, spent, now, day)

    async def check_budget(
        self, tenant: TenantConfig, *, spend: RequestSpend | None = None
    ) -> BudgetCheck | None:
        """Raises BudgetExceeded when the tenant's day is spent; the check passed (None: the
        tenant has no budget). `spend`: the request's it is made for."""
        budget = tenant.daily_budget_usd
        if budget is None:
            return None
        now = self._clock()
        day = utc_day(now)
        spent = await self._spent(tenant.id, day, spend)
        return self._judge_budget(tenant, budget, spent, now, day)

    def _judge_budget(
        self, tenant: TenantConfig, budget: float, spent: float, now: float, day: str
    ) -> BudgetCheck:
        if spent >= budget:
            self._metrics.quota_refusals.labels("budget").inc()
            raise BudgetExceeded(
                f"tenant {tenant.id} has spent its daily budget of ${budget:g} "
                f"(daily_budget_usd) for {day} UTC; it resets at 00:00 UTC",
                retry_after_s=seconds_to_midnight(now),
            )
        return BudgetCheck(tenant.id, time.monotonic(), self._spends.get(tenant.id, 0))

    def stands(self, check: BudgetCheck | None, tenant: TenantConfig) -> bool:
        """Whether `check` stands for the tenant's model call about to start: made moments
        ago, and no spend of the tenant's kept by this process since (the request's own
        rewrite's, say)."""
        return (
            check is not None
            and check.tenant == tenant.id
            and time.monotonic() - check.at < _CHECK_STANDS_S
            and check.spends == self._spends.get(tenant.id, 0)
        )

    async def record_spend(self, tenant: TenantConfig, usd: float) -> None:
        """Add one model call's cost to the tenant's day. Never raises: a store that fails
        keeps the amount here and adds it when it is back."""
        ticket = self._keep(tenant, usd)
        if ticket is not None and self._outbox is not None:
            await self._outbox.send(ticket)

    def record_spend_nowait(self, tenant: TenantConfig, usd: float) -> asyncio.Task[None] | None:
        """`record_spend` for a caller that must not await (a call being cancelled): the
        amount is kept here at once, and sent to the shared store by a task of its own
        (returned, for a caller that may wait for it; None when there is nothing to send)."""
        ticket = self._keep(tenant, usd)
        if ticket is None or self._outbox is None:
            return None
        return self._outbox.send_nowait(ticket)

    async def ping(self) -> None:
        """Probe the shared store (gateway.core.health, on a timer): clears the degraded state
        once it answers, with or without traffic, then adds the spend kept while it was
        down. Raises BackendError while it is unreachable."""
        if self._shared is None or self._outbox is None:
            return
        await self._shared.ping()
        await self._outbox.flush(FLUSH_WAIT_S)

    async def settled(self) -> None:
        """Wait for the shared store's verdict on a call a request's budget cut, if a probe
        is finding it: `degraded` then says what the next requests get."""
        if self._shared is not None:
            await self._shared.settled()

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """A bounded last try at adding the spend not yet in the shared store (`SpendOutbox`),
        then the stores closed."""
        if self._shared is not None and self._outbox is not None:
            await self._outbox.aclose(timeout_s)
            await self._shared.aclose()
        await self._local.aclose()

    # -- the shared store, and the fallback -----------------------------------------------

    def _keep(self, tenant: TenantConfig, usd: float) -> Ticket | None:
        """The amount kept in this process, without an await; its ticket, when it is to be
        sent to the shared store."""
        if not usd > 0:
            return None
        self._spends[tenant.id] = self._spends.get(tenant.id, 0) + 1
        day = utc_day(self._clock())
        if self._outbox is None:
            self._local.add_spend_now(tenant.id, day, usd)
            return None
        return self._outbox.keep((tenant.id, day), usd)

    async def _take(
        self, tenant: str, rate: float, burst: int, spend: RequestSpend | None
    ) -> float:
        if self._shared is not None:
            store = self._shared.store
            wait = await self._shared.ask(
                lambda: store.take(tenant, rate, burst, spend=spend), tenant, spend=spend
            )
            if wait is not None:
                return wait
            self._metrics.quota_local_decisions.labels("rate_limit").inc()
        return await self._local.take(tenant, rate, burst)

    async def _take_and_spent(
        self, tenant: str, rate: float, burst: int, day: str, spend: RequestSpend | None
    ) -> tuple[float, float]:
        """`_take` and `_spent` in one call to the shared store; each falls back as they do."""
        if self._shared is not None:
            shared, store, key = self._shared, self._shared.store, (tenant, day)
            both = await shared.ask(
                lambda: store.take_and_spent(tenant, rate, burst, day, spend=spend),
                tenant,
                spend=spend,
            )
            if both is not None:
                wait, total = both
                shared.seen(key, total)
                return wait, total + self._outstanding(key)
            # Both decided here, as `_take` and `_spent` would (without asking again).
            self._metrics.quota_local_decisions.labels("rate_limit").inc()
            wait = await self._local.take(tenant, rate, burst)
            if wait > 0:
                return wait, 0.0  # refused by its rate limit, whatever it has spent
            return wait, self._last_known(key) + self._outstanding(key)
        return await self._take(tenant, rate, burst, spend), await self._spent(tenant, day, spend)

    async def _spent(self, tenant: str, day: str, spend: RequestSpend | None) -> float:
        """The shared total plus what this process has not yet added to it. Never a round
        trip for other tenants' spend: that is sent by the calls that recorded it, and by
        the probe (`ping`)."""
        if self._shared is None:
            return await self._local.spent(tenant, day)
        shared, store, key = self._shared, self._shared.store, (tenant, day)
        total = await shared.ask(
            lambda: store.spent(tenant, day, spend=spend), tenant, day, spend=spend
        )
        if total is None:
            total = self._last_known(key)
        else:
            shared.seen(key, total)
        return total + self._outstanding(key)

    def _last_known(self, key: Key) -> float:
        """The day's total as the shared store last gave it, for a decision made without it.
        Never given while the store is down (this process started, or the day began, during the
        outage): refused, since counting from nothing would hand a spent tenant a new day's
        budget. The store up but not asked (the request's own Redis time spent, the tenant's
        keys repaired): that one decision counts from nothing, the next reads the total."""
        assert self._shared is not None
        total = self._shared.last_seen(key)
        if total is None and self._shared.degraded:
            self._metrics.quota_refusals.labels("budget_unknown").inc()
            raise BudgetUnknown(
                f"the quota store is unavailable and this process has not read tenant "
                f"{key[0]}'s spend for {key[1]} UTC (daily_budget_usd); retry shortly",
                retry_after_s=retry_after(self._shared.retry_s),
            )
        self._metrics.quota_local_decisions.labels("budget").inc()
        return total or 0.0

    def _outstanding(self, key: Key) -> float:
        """This process's spend of the key not yet confirmed by the shared store."""
        return self._outbox.outstanding().get(key, 0.0) if self._outbox is not None else 0.0


def warn_if_per_worker(tenants: Sequence[TenantConfig], quotas: Quotas) -> None:
    """One warning at start when limits are configured, kept in this process's memory, and
    this process is one of several workers: each enforces them alone, so the fleet admits N
    times the rate and spends up to N times the daily budget."""
    limited = [t.id for t in tenants if t.rate_limit is not None or t.daily_budget_usd]
    if limited and not quotas.is_shared and os.environ.get(MULTIPROC_ENV):
        log.warning(
            "rate limits and budgets are kept per worker process (no Redis): with N workers "
            "each tenant gets N times its rate limit and up to N times its daily budget; set "
            "quotas.backend: redis (or cache.backend: redis) to share them",
            extra={"tenants": limited},
        )
