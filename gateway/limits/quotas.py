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
  every model call (`BudgetedLLM`); each call's cost is added after it. Spent: 429
  `budget_exceeded` naming the budget, with Retry-After until 00:00 UTC. Never a cheaper tier.
  Calls already running when the budget runs out finish, so a day's spend can pass the budget
  by at most the calls in flight at that moment. An agent loop that finds its budget spent at
  its next turn stops there with that 429: its earlier turns are recorded, no partial answer.
  A call cut before its usage arrived (client hang-up, upstream failure after some text) is
  charged an estimate (`BudgetedLLM`), so hanging up is no way round a budget.

Redis down or slow (`BackendUnavailable`): every decision falls back to this process's own
counters at once (`querygate_quota_local_decisions_total`, `querygate_quota_store_degraded`,
one warning per outage), and Redis is asked again every `quotas.redis_retry_s` until it
answers, and by the health probe (`ping`), which clears the gauge without traffic and sends
the spend kept here (each amount with its id: not added twice, see backends/quotas/redis.py).
One tenant's keys holding garbage is that tenant's problem only: logged, repaired, and that
one decision made here. Meanwhile each process enforces the rate limit alone (a fleet of N
admits up to N times the rate and burst) and the budget from the last total it read plus its
own spend since (the fleet can pass the budget by up to N-1 times what was left). Spend
recorded during the outage is added to Redis when it is back, so the day's total there stays
right. Failing open keeps answering through a Redis outage; the overshoot is bounded by the
outage's length and the fleet's size, which we judge better than refusing every tenant's paid
traffic.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing
from contextvars import ContextVar
from typing import Any, TypeVar

from backends.errors import BackendError, BackendUnavailable
from backends.llm.base import (
    LLM,
    NO_OPTIONS,
    Completion,
    GenerationOptions,
    Message,
    StreamDelta,
    Tier,
    WrappedLLM,
)
from backends.quotas.base import QuotaStore
from backends.quotas.memory import MemoryQuotaStore
from backends.redis_client import RequestBudgetSpent, unbudgeted
from gateway.errors import TooManyRequests
from gateway.limits.metering import estimate_usage, settled
from gateway.obs.metrics import MULTIPROC_ENV, Metrics
from gateway.settings import TenantConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long `ping` waits for the spend kept while the store was down (well under the health
# probe's timeout); the rest is sent in the background.
FLUSH_WAIT_S = 1.0

# The tenant whose request is being served: set by the limits middleware, read before and
# after every model call. None outside a request (the CLI, benchmarks): no budget applies.
current_tenant: ContextVar[TenantConfig | None] = ContextVar("quota_tenant", default=None)
# The tenant whose budget a stream's handler has just checked, before its headers (so that a
# refusal is a plain 429): the stream's model call, next, does not read it again.
budget_checked: ContextVar[tuple[str, float, int] | None] = ContextVar(
    "quota_budget_checked", default=None
)


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
        # added to it. Spend not yet sent is one sum per (tenant, day); once sent, an amount
        # keeps its id until Redis confirms it (a replay of an amount that was in fact added,
        # its reply lost, is then not added twice); while its reply is awaited it is in flight.
        self._last_seen: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], float] = {}
        self._unconfirmed: dict[tuple[str, str], list[tuple[str, float]]] = {}
        self._in_flight: dict[tuple[str, str], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._flushing: asyncio.Task[None] | None = None  # spend kept while down, going back
        # Spends kept per tenant (a count): a budget check stands only while it is unchanged.
        self._spends: dict[str, int] = {}
        # Amount ids are `<origin>:<seq>`: the store keeps each origin's latest seq per tenant
        # and day, so one (tenant, day)'s amounts are sent one at a time, in seq order, an
        # unconfirmed one again before any later one (`_senders`). Then a replay is told apart
        # however many amounts other processes added meanwhile, in one field per process.
        self._origin = secrets.token_hex(8)
        self._seq = 0
        self._senders: dict[tuple[str, str], asyncio.Lock] = {}
        # Amounts kept so far (a count, all keys), and per key that count when its latest
        # send that confirmed everything took the key's spend: a record kept before it
        # waited its turn for nothing (its amount went in that send). Else each record's
        # turn cost a round trip, and a busy tenant's records queued up without end.
        self._kept = 0
        self._confirmed: dict[tuple[str, str], int] = {}
        metrics.quota_store_degraded.set(0)

    @property
    def store_name(self) -> str:
        return self._shared.name if self._shared is not None else self._local.name

    @property
    def is_shared(self) -> bool:
        """Whether the limits are kept in a shared store (which `ping` probes)."""
        return self._shared is not None

    # -- the checks -----------------------------------------------------------------------

    async def admit(self, tenant: TenantConfig, *, answering: bool) -> None:
        """A request has arrived: its tenant's rate limit, then (for an endpoint that answers
        with a model) its budget. Raises RateLimited or BudgetExceeded. Both in one round trip
        to the shared store; the budget check then stands in for the request's first model
        call's own (`budget_checked`), as a stream's does."""
        limit = tenant.rate_limit
        budget = tenant.daily_budget_usd if answering else None
        if limit is None:
            if answering:
                await self.check_budget(tenant, before_stream=True)
            return
        now = self._clock()
        day = utc_day(now)
        if budget is None:
            wait, spent = await self._take(tenant.id, limit.requests_per_s, limit.burst), 0.0
        else:
            wait, spent = await self._take_and_spent(
                tenant.id, limit.requests_per_s, limit.burst, day
            )
        if wait > 0:
            self._metrics.quota_refusals.labels("rate_limit").inc()
            seconds = retry_after(wait)
            raise RateLimited(
                f"tenant {tenant.id} is over its rate limit of {limit.requests_per_s:g} "
                f"requests/s (burst {limit.burst}); retry in {seconds} s",
                retry_after_s=seconds,
            )
        if budget is not None:
            self._judge_budget(tenant, budget, spent, now, day, before_stream=True)

    async def check_budget(self, tenant: TenantConfig, *, before_stream: bool = False) -> None:
        """Raises BudgetExceeded when the tenant's day is spent. `before_stream`: the check
        that precedes a stream's one model call, which then does not check again (nor does
        this one when the request's arrival has just checked it)."""
        budget = tenant.daily_budget_usd
        if budget is None:
            return
        if before_stream and self._stands(tenant, consume=False):
            return
        now = self._clock()
        day = utc_day(now)
        spent = await self._spent(tenant.id, day)
        self._judge_budget(tenant, budget, spent, now, day, before_stream=before_stream)

    def _judge_budget(
        self,
        tenant: TenantConfig,
        budget: float,
        spent: float,
        now: float,
        day: str,
        *,
        before_stream: bool,
    ) -> None:
        if spent >= budget:
            self._metrics.quota_refusals.labels("budget").inc()
            raise BudgetExceeded(
                f"tenant {tenant.id} has spent its daily budget of ${budget:g} "
                f"(daily_budget_usd) for {day} UTC; it resets at 00:00 UTC",
                retry_after_s=seconds_to_midnight(now),
            )
        if before_stream:
            budget_checked.set((tenant.id, time.monotonic(), self._spends.get(tenant.id, 0)))

    def _stands(self, tenant: TenantConfig, *, consume: bool = True) -> bool:
        """Whether this request's last budget check stands for the model call about to start:
        made moments ago, and no spend of the tenant's kept by this process since (its own
        rewrite's, say, which may run in another task). Consumed: a second call checks."""
        checked = budget_checked.get()
        if consume:
            budget_checked.set(None)
        return (
            checked is not None
            and checked[0] == tenant.id
            and time.monotonic() - checked[1] < _CHECK_STANDS_S
            and checked[2] == self._spends.get(tenant.id, 0)
        )

    async def record_spend(self, tenant: TenantConfig, usd: float) -> None:
        """Add one model call's cost to the tenant's day. Never raises: a store that fails
        keeps the amount here and adds it when it is back."""
        kept = self._keep(tenant, usd)
        if kept is not None:
            await self._flush_key(kept[0], counted=True, kept=kept[1])

    def record_spend_nowait(self, tenant: TenantConfig, usd: float) -> asyncio.Task[None] | None:
        """`record_spend` for a caller that must not await (a call being cancelled): the
        amount is kept here at once, and sent to the shared store by a task of its own
        (returned, for a caller that may wait for it; None when there is nothing to send)."""
        kept = self._keep(tenant, usd)
        if kept is None:
            return None
        return self._spawn(self._send(*kept))

    async def ping(self) -> None:
        """Probe the shared store (gateway.core.health, on a timer): clears the degraded state
        once it answers, with or without traffic, then adds the spend kept while it was
        down. Raises BackendError while it is unreachable."""
        if self._shared is None:
            return
        try:
            await self._shared.ping()
        except BackendUnavailable as exc:
            self._down(exc)
            raise
        self._up()
        # One round trip per tenant-day kept: after a long outage with many tenants, more
        # than the probe's timeout, which would report a store that answers as down and cut
        # the sends half-way. They run in a task of their own; the probe waits only briefly.
        last = self._flushing
        if last is not None and last.done():
            self._flushing = None
            last.result()  # a bug in the last sends surfaces in the probe, as it did inline
        if self._flushing is None:
            self._flushing = self._spawn(self._flush_all())
        done, _ = await asyncio.wait({self._flushing}, timeout=FLUSH_WAIT_S)
        if done:
            self._flushing = None
            done.pop().result()

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """A bounded last try at adding the spend not yet in the shared store; what is left
        is logged per tenant (it is lost: the fleet's total for the day under-counts it)."""
        if self._shared is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    if self._tasks:
                        await asyncio.gather(*self._tasks, return_exceptions=True)
                    self._retry_at = 0.0  # one last try, even within the retry interval
                    await self._flush_all()
            except TimeoutError:
                pass
            for task in self._tasks:
                task.cancel()
            for (tenant, day), usd in sorted(self._outstanding().items()):
                log.warning(
                    "spend not added to the quota store at shutdown",
                    extra={"tenant": tenant, "day": day, "usd": usd, "store": self.store_name},
                )
            await self._shared.aclose()
        await self._local.aclose()

    # -- the shared store, and the fallback -----------------------------------------------

    def _keep(self, tenant: TenantConfig, usd: float) -> tuple[tuple[str, str], int] | None:
        """The amount kept in this process, without an await; the key to send, if any, and
        the amount's number (`_kept`)."""
        if not usd > 0:
            return None
        self._spends[tenant.id] = self._spends.get(tenant.id, 0) + 1
        day = utc_day(self._clock())
        if self._shared is None:
            self._local.add_spend_now(tenant.id, day, usd)
            return None
        key = (tenant.id, day)
        self._pending[key] = self._pending.get(key, 0.0) + usd
        self._kept += 1
        return key, self._kept

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _send(self, key: tuple[str, str], kept: int) -> None:
        unbudgeted()  # after the answer: not on the request's Redis budget
        await self._flush_key(key, counted=True, kept=kept)

    async def _take(self, tenant: str, rate: float, burst: int) -> float:
        if self._shared is not None:
            shared = self._shared
            wait = await self._ask(lambda: shared.take(tenant, rate, burst), tenant)
            if wait is not None:
                return wait
            self._metrics.quota_local_decisions.labels("rate_limit").inc()
        return await self._local.take(tenant, rate, burst)

    async def _take_and_spent(
        self, tenant: str, rate: float, burst: int, day: str
    ) -> tuple[float, float]:
        """`_take` and `_spent` in one call to the shared store; each falls back as they do."""
        if self._shared is not None:
            shared, key = self._shared, (tenant, day)
            both = await self._ask(lambda: shared.take_and_spent(tenant, rate, burst, day), tenant)
            if both is not None:
                wait, total = both
                self._seen(key, total)
                return wait, total + self._outstanding().get(key, 0.0)
            # Both decided here, as `_take` and `_spent` would (without asking again).
            self._metrics.quota_local_decisions.labels("rate_limit").inc()
            self._metrics.quota_local_decisions.labels("budget").inc()
            wait = await self._local.take(tenant, rate, burst)
            return wait, self._last_seen.get(key, 0.0) + self._outstanding().get(key, 0.0)
        return await self._take(tenant, rate, burst), await self._spent(tenant, day)

    async def _spent(self, tenant: str, day: str) -> float:
        """The shared total plus what this process has not yet added to it. Never a round
        trip for other tenants' spend: that is sent by the calls that recorded it, and by
        the probe (`ping`)."""
        if self._shared is None:
            return await self._local.spent(tenant, day)
        shared, key = self._shared, (tenant, day)
        total = await self._ask(lambda: shared.spent(tenant, day), tenant, day)
        if total is None:
            self._metrics.quota_local_decisions.labels("budget").inc()
            total = self._last_seen.get(key, 0.0)
        else:
            self._seen(key, total)
        return total + self._outstanding().get(key, 0.0)

    def _outstanding(self) -> dict[tuple[str, str], float]:
        """Spend not yet confirmed by the shared store, per (tenant, day). An amount in
        flight or unconfirmed may be in the total already: counting it again errs towards
        refusing, for one round trip or until the replay confirms it."""
        out: dict[tuple[str, str], float] = {}
        for key, usd in self._pending.items():
            out[key] = out.get(key, 0.0) + usd
        for key, batches in self._unconfirmed.items():
            out[key] = out.get(key, 0.0) + sum(usd for _, usd in batches)
        for key, usd in self._in_flight.items():
            out[key] = out.get(key, 0.0) + usd
        return {k: v for k, v in out.items() if v > 0}

    async def _flush_all(self) -> None:
        for key in sorted(set(self._pending) | set(self._unconfirmed)):
            if not await self._flush_key(key, counted=False):
                return

    async def _flush_key(
        self, key: tuple[str, str], *, counted: bool, kept: int | None = None
    ) -> bool:
        """Send the key's spend not yet in the shared store: amounts already sent once with
        their ids, the rest as one new amount. True when all of it is confirmed. `counted`:
        a model call's cost that stays here counts as one local decision. One send per key
        at a time (the ids' order, see __init__); spend kept meanwhile waits and goes in the
        next one, as one amount. `kept`: the number of the amount this call is for; when a
        send that took it is confirmed while this one waits, there is nothing to do."""
        sender = self._senders.get(key)
        if sender is None:
            if key[1] not in {day for _, day in self._senders}:
                # A new day: drop the senders of days that are over and idle.
                self._senders = {
                    k: lock for k, lock in self._senders.items() if k[1] >= key[1] or lock.locked()
                }
                self._confirmed = {k: n for k, n in self._confirmed.items() if k in self._senders}
            sender = self._senders[key] = asyncio.Lock()
        async with sender:
            if kept is not None and self._confirmed.get(key, 0) >= kept:
                return True
            return await self._send_in_order(key, counted=counted)

    async def _send_in_order(self, key: tuple[str, str], *, counted: bool) -> bool:
        assert self._shared is not None
        shared = self._shared
        tenant, day = key
        if self._monotonic() < self._retry_at:
            # Not asked at all: the spend stays one sum, sent once the store is back.
            if counted:
                self._metrics.quota_local_decisions.labels("spend").inc()
            return False
        batches = self._unconfirmed.pop(key, [])
        usd = self._pending.pop(key, 0.0)
        taken = self._kept  # every amount of the key kept so far: in `batches`, or confirmed
        if usd > 0:
            self._seq += 1
            batches.append((f"{self._origin}:{self._seq}", usd))
        if not batches:
            self._confirmed[key] = taken
            return True
        sent = 0
        self._in_flight[key] = self._in_flight.get(key, 0.0) + sum(u for _, u in batches)
        try:
            for amount_id, amount in batches:
                total = await self._ask(
                    lambda: shared.add_spend(tenant, day, amount, amount_id),  # noqa: B023
                    tenant,
                    day,
                )
                if total is None:
                    break  # none later is sent before this one is confirmed
                self._seen(key, total)
                sent += 1
        finally:
            self._in_flight.pop(key, None)  # one send per key: nothing else is in flight
            if sent < len(batches):
                # Only the one tried may have been added (its reply lost): it keeps its id.
                # The rest, never sent, is one sum again, so that an outage leaves one
                # amount per key, not one more per retry, each a round trip once it ends.
                self._unconfirmed[key] = batches[sent : sent + 1]
                if rest := sum(u for _, u in batches[sent + 1 :]):
                    self._pending[key] = self._pending.get(key, 0.0) + rest
        if sent < len(batches):
            if counted:
                self._metrics.quota_local_decisions.labels("spend").inc()
            return False
        self._confirmed[key] = taken
        return True

    def _seen(self, key: tuple[str, str], total: float) -> None:
        if key not in self._last_seen and self._last_seen:
            # A new (tenant, day): drop totals of days that are over.
            self._last_seen = {k: v for k, v in self._last_seen.items() if k[1] >= key[1]}
        self._last_seen[key] = max(total, self._last_seen.get(key, 0.0))

    async def _ask(
        self, call: Callable[[], Awaitable[T]], tenant: str, day: str | None = None
    ) -> T | None:
        """The shared store's answer, or None. Unreachable or too slow (BackendUnavailable):
        the whole store is down, and it is not asked again for `retry_s` (so an outage costs
        one timeout per interval). Any other error is this tenant's keys holding something
        unusable: logged, repaired, and only this decision is made here."""
        now = self._monotonic()
        if now < self._retry_at:
            return None
        if self.degraded:
            # Half-open: this call alone asks the store that was down; the calls that arrive
            # while it waits for its answer (a slow Redis: up to a timeout) decide here,
            # rather than each paying that timeout too.
            self._retry_at = now + self._retry_s
        try:
            result = await call()
        except RequestBudgetSpent:
            return None  # this request's own doing: the store's state stands for the others
        except BackendUnavailable as exc:
            self._down(exc)
            return None
        except BackendError as exc:
            await self._repair(tenant, day or utc_day(self._clock()), exc)
            return None
        self._up()
        return result

    async def _repair(self, tenant: str, day: str, exc: BackendError) -> None:
        assert self._shared is not None
        usd = self._last_seen.get((tenant, day), 0.0)
        log.warning(
            "a tenant's quota keys are unusable: repaired, this decision made here",
            extra={"tenant": tenant, "store": self.store_name, "error": str(exc), "usd": usd},
        )
        try:
            await self._shared.repair(tenant, day, usd)
        except BackendError as failed:
            log.warning("quota keys not repaired", extra={"tenant": tenant, "error": str(failed)})

    def _down(self, exc: BackendError) -> None:
        self._retry_at = self._monotonic() + self._retry_s
        if not self.degraded:
            self.degraded = True
            self._metrics.quota_store_degraded.set(1)
            log.warning(
                "quota store unavailable: rate limits and budgets are enforced per "
                "process until it is back",
                extra={"store": self.store_name, "error": str(exc)},
            )

    def _up(self) -> None:
        self._retry_at = 0.0
        if self.degraded:
            self.degraded = False
            self._metrics.quota_store_degraded.set(0)
            log.warning("quota store back: rate limits and budgets are shared again")


class BudgetedLLM(WrappedLLM):
    """The LLM seam with the current request's tenant's budget around every call: checked
    before it (BudgetExceeded), its cost recorded after it. Built once per process around the
    tiers, so every model call of every stage and route (rewrite, agent turns, final answers,
    streams) passes through it. A call outside a request (no tenant) is not budgeted.

    A call cut before its usage arrived is charged an estimate (`estimate_usage`, the same
    tokens `MeteredLLM` counts): a stream without its final delta (the client hung up, the
    upstream failed after some text) its prompt plus the text so far; a completion cancelled
    while it waits its prompt. A call that failed with nothing answered is not charged. The
    charge is kept without an await, so the cancellation cannot erase it."""

    def __init__(self, inner: LLM, quotas: Quotas) -> None:
        super().__init__(inner)
        self._quotas = quotas

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
        if tenant is not None and not self._quotas._stands(tenant):
            await self._quotas.check_budget(tenant)
        try:
            completion = await self._inner.complete(
                tier, messages, tools=tools, max_tokens=max_tokens, route=route, options=options
            )
        except asyncio.CancelledError:
            if tenant is not None:
                usage = estimate_usage(self._inner, tier, messages, "")
                self._quotas.record_spend_nowait(tenant, usage.cost_usd)
            raise
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
        if tenant is not None and not self._quotas._stands(tenant):
            await self._quotas.check_budget(tenant)
        stream = self._inner.stream(
            tier, messages, max_tokens=max_tokens, route=route, options=options
        )
        if tenant is None:  # outside a request: not budgeted
            async for delta in stream:
                yield delta
            return
        budgeted = tenant

        async def done(delta: StreamDelta) -> None:
            if delta.usage is not None:
                await self._record(budgeted, delta.usage.cost_usd)

        def cut(text: str, model: str) -> None:
            usage = estimate_usage(self._inner, tier, messages, text, model)
            self._quotas.record_spend_nowait(budgeted, usage.cost_usd)

        async with aclosing(settled(stream, done, cut)) as deltas:
            async for delta in deltas:
                yield delta

    async def _record(self, tenant: TenantConfig, usd: float) -> None:
        # Kept at once, sent by a task of its own that nothing waits for: no answer depends
        # on it (this process's next checks count it while it is unconfirmed), and a client
        # that hangs up while it is being sent does not erase a call that was paid for.
        self._quotas.record_spend_nowait(tenant, usd)


# How long a stream handler's budget check stands in for its model call's own.
_CHECK_STANDS_S = 5.0


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
