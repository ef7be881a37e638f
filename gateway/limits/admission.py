"""Admission control: how much work runs at once, how much may wait, and each tenant's share.

Per process, one pool per class of work (queries; document writes), each bounded by
`server.admission` (read at every admission, so a reload applies at once):

- a request runs at once when the pool and its tenant are both under their in-flight caps and
  none of the tenant's own requests is waiting;
- otherwise it waits in its tenant's queue, which is bounded (`tenant_max_queued`): past it the
  tenant is over its share and gets 429 at once;
- the pool's waiting room is bounded too (`max_queued`): when it is full, a newcomer takes the
  place of the newest waiter of the tenant with the longest queue (that waiter gets 429) if
  that queue is longer than the newcomer's own by two; otherwise the newcomer gets 503;
- freed slots go to tenants in turn (round robin), each tenant's waiters in arrival order, so a
  tenant with one request waits behind at most one request of each other tenant;
- a waiter waits at most `max_queue_wait_s` and never past its deadline; one whose deadline
  passed is dropped (503) before any work is done for it.

Every refusal carries Retry-After. Nothing here is shared between processes: each worker of a
deployment admits on its own.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.errors import (
    DEADLINE_RETRY_AFTER_S,
    DeadlineExceeded,
    ServiceUnavailable,
    TooManyRequests,
)
from gateway.obs.metrics import Metrics
from gateway.settings import AdmissionConfig, PoolLimits


class TenantOverShare(TooManyRequests):
    """The tenant already has its share of this pool running and waiting."""

    outcome = "shed_tenant"


class Saturated(ServiceUnavailable):
    """The process has no room for more work of this class."""

    type = "overloaded"
    outcome = "shed_process"


def _deadline_passed(waited: bool) -> DeadlineExceeded:
    where = "while it waited for admission" if waited else "before it was admitted"
    return DeadlineExceeded(
        f"the request deadline passed {where}", retry_after_s=DEADLINE_RETRY_AFTER_S
    )


@dataclass(eq=False, slots=True)
class _Waiter:
    tenant: str
    deadline: float
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Pool:
    """One class of work. Single-threaded (the event loop's), so no locks."""

    def __init__(self, name: str, metrics: Metrics | None = None) -> None:
        self.name = name
        self._metrics = metrics
        self._limits: PoolLimits | None = None
        self._retry_after_s = 1
        self.running = 0
        self._inflight: Counter[str] = Counter()
        self._queues: dict[str, deque[_Waiter]] = {}
        self._turns: deque[str] = deque()  # tenants with waiters, in round-robin order
        self.queued = 0

    def configure(self, limits: PoolLimits, config: AdmissionConfig) -> None:
        """New limits (a reload): waiters that now fit run at once, not when a request ends."""
        self._limits, self._retry_after_s = limits, config.retry_after_s
        self._dispatch()

    @asynccontextmanager
    async def admit(
        self, tenant: str, deadline: float, limits: PoolLimits, config: AdmissionConfig
    ) -> AsyncIterator[None]:
        await self._acquire(tenant, deadline, limits, config)
        try:
            yield
        finally:
            self._release(tenant)

    async def _acquire(
        self, tenant: str, deadline: float, limits: PoolLimits, config: AdmissionConfig
    ) -> None:
        if (limits, config.retry_after_s) != (self._limits, self._retry_after_s):
            self.configure(limits, config)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= deadline:
            raise _deadline_passed(waited=False)
        own = self._queues.get(tenant)
        if (
            self.running < limits.max_inflight
            and self._inflight[tenant] < limits.tenant_max_inflight
            and not own
        ):
            self._grant(tenant)
            return
        queued_own = len(own) if own else 0
        if queued_own >= limits.tenant_max_queued:
            if queued_own or self._inflight[tenant] >= limits.tenant_max_inflight:
                raise self._over_share()
            raise self._saturated()  # no waiting room at all, and the pool is full
        if self.queued >= limits.max_queued:
            self._prune(now)
        if self.queued >= limits.max_queued and not self._push_out(tenant):
            raise self._saturated()
        waiter = _Waiter(tenant, deadline)
        self._enqueue(waiter)
        try:
            async with asyncio.timeout_at(min(deadline, now + config.max_queue_wait_s)):
                await waiter.granted
        except TimeoutError:
            self._abandon(waiter)
            if loop.time() >= deadline:
                raise _deadline_passed(waited=True) from None
            raise Saturated(
                f"waited {config.max_queue_wait_s:g} s for a {self.name} slot; retry shortly",
                retry_after_s=self._retry_after_s,
            ) from None
        except BaseException:
            self._abandon(waiter)  # cancelled (the client left, shutdown) or pushed out
            raise

    def _over_share(self) -> TenantOverShare:
        return TenantOverShare(
            f"too many concurrent {self.name} requests for this tenant; retry shortly",
            retry_after_s=self._retry_after_s,
        )

    def _saturated(self) -> Saturated:
        return Saturated(
            f"the gateway is at capacity for {self.name}; retry shortly",
            retry_after_s=self._retry_after_s,
        )

    def _grant(self, tenant: str) -> None:
        self.running += 1
        self._inflight[tenant] += 1
        self._report()

    def _release(self, tenant: str) -> None:
        self.running -= 1
        self._inflight[tenant] -= 1
        if self._inflight[tenant] <= 0:
            del self._inflight[tenant]
        self._dispatch()
        self._report()

    def _enqueue(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.tenant)
        if queue is None:
            queue = self._queues[waiter.tenant] = deque()
            self._turns.append(waiter.tenant)
        queue.append(waiter)
        self.queued += 1
        self._report()

    def _remove(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.tenant)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        self.queued -= 1
        if not queue:
            self._drop_tenant(waiter.tenant)
        self._report()

    def _drop_tenant(self, tenant: str) -> None:
        del self._queues[tenant]
        self._turns.remove(tenant)

    def _abandon(self, waiter: _Waiter) -> None:
        """The waiter stops waiting: out of the queue, or its slot given back if it had one."""
        granted = waiter.granted
        if granted.done() and not granted.cancelled() and granted.exception() is None:
            self._release(waiter.tenant)
        else:
            self._remove(waiter)

    def _dispatch(self) -> None:
        """Give free slots to waiting tenants in turn."""
        limits = self._limits
        if limits is None:
            return
        now = asyncio.get_running_loop().time()
        while self.running < limits.max_inflight:
            waiter = self._next_waiter(limits, now)
            if waiter is None:
                break
            self._grant(waiter.tenant)
            waiter.granted.set_result(None)
        self._report()  # waiters may have expired without a grant

    def _next_waiter(self, limits: PoolLimits, now: float) -> _Waiter | None:
        for _ in range(len(self._turns)):
            if not self._turns:
                return None
            tenant = self._turns.popleft()
            queue = self._queues[tenant]
            self._expire(queue, now)
            if not queue:
                del self._queues[tenant]
                continue
            if self._inflight[tenant] >= limits.tenant_max_inflight:
                self._turns.append(tenant)
                continue
            waiter = queue.popleft()
            self.queued -= 1
            if queue:
                self._turns.append(tenant)
            else:
                del self._queues[tenant]
            return waiter
        return None

    def _expire(self, queue: deque[_Waiter], now: float) -> None:
        """Drop waiters that are gone or whose deadline passed: no work is done for them."""
        kept = [w for w in queue if not w.granted.done() and w.deadline > now]
        for waiter in queue:
            if not waiter.granted.done() and waiter.deadline <= now:
                waiter.granted.set_exception(_deadline_passed(waited=True))
        self.queued -= len(queue) - len(kept)
        queue.clear()
        queue.extend(kept)
        self._report()

    def _prune(self, now: float) -> None:
        for tenant in list(self._queues):
            queue = self._queues[tenant]
            self._expire(queue, now)
            if not queue:
                self._drop_tenant(tenant)

    def _push_out(self, tenant: str) -> bool:
        """Make room for `tenant` by refusing the newest waiter of the longest queue, when
        that queue is longer than the tenant's own by two (else the two would only swap)."""
        if not self._queues:
            return False
        heaviest = max(self._queues, key=lambda t: len(self._queues[t]))
        own = len(self._queues.get(tenant, ()))
        if len(self._queues[heaviest]) < own + 2:
            return False
        victim = self._queues[heaviest].pop()
        self.queued -= 1
        if not self._queues[heaviest]:
            self._drop_tenant(heaviest)
        victim.granted.set_exception(self._over_share())
        self._report()
        return True

    def _report(self) -> None:
        if self._metrics is not None:
            self._metrics.admission_inflight.labels(self.name).set(self.running)
            self._metrics.admission_queued.labels(self.name).set(self.queued)


# The pools, by class of work (the `querygate_admission_*` label).
POOLS = ("queries", "writes")


class Admission:
    """The process's pools, by class of work."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.queries, self.writes = (Pool(name, metrics) for name in POOLS)

    def pool(self, kind: str) -> Pool:
        return self.queries if kind == "queries" else self.writes

    def configure(self, config: AdmissionConfig) -> None:
        """Apply reloaded limits to both pools at once."""
        self.queries.configure(config.queries, config)
        self.writes.configure(config.writes, config)
