"""Quotas held in this process: token buckets and daily spend per tenant.

The store of a deployment with no Redis (each process enforces the limits on its own), and
the fallback the gateway uses while Redis is unreachable (`gateway.limits.quotas`). The bucket
maths is `refill_and_take`; the Redis store's script does the same sums on the server. A
request's `spend` (its Redis time budget) is taken and not used: nothing here waits on Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from backends.redis_client import RequestSpend


def refill_and_take(
    tokens: float, last: float, now: float, rate_per_s: float, burst: float
) -> tuple[float, float]:
    """A bucket that held `tokens` at `last`, seen at `now`: refilled at `rate_per_s` up to
    `burst`, then one token taken if there is one. Returns (tokens left, seconds to wait):
    wait 0.0 means taken; otherwise nothing was taken and one token will be there in `wait`.
    A clock that went backwards refills nothing (never a negative refill)."""
    tokens = min(burst, tokens + max(now - last, 0.0) * rate_per_s)
    if tokens >= 1.0:
        return tokens - 1.0, 0.0
    return tokens, (1.0 - tokens) / rate_per_s


class MemoryQuotaStore:
    """Per process, single-threaded (the event loop's): every update is atomic by
    construction. Buckets are one per tenant (tenants come from config, so bounded); spend
    is kept for the latest day seen only."""

    name = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, last seen)
        self._spend: dict[tuple[str, str], float] = {}  # (tenant, day) -> USD
        self._day = ""
        self._closed = False

    async def take(
        self, tenant: str, rate_per_s: float, burst: float, *, spend: RequestSpend | None = None
    ) -> float:
        self._check_open()
        now = self._clock()
        tokens, last = self._buckets.get(tenant, (burst, now))
        tokens, wait = refill_and_take(tokens, last, now, rate_per_s, burst)
        self._buckets[tenant] = (tokens, max(now, last))
        return wait

    async def take_and_spent(
        self,
        tenant: str,
        rate_per_s: float,
        burst: float,
        day: str,
        *,
        spend: RequestSpend | None = None,
    ) -> tuple[float, float]:
        return await self.take(tenant, rate_per_s, burst), await self.spent(tenant, day)

    async def spent(self, tenant: str, day: str, *, spend: RequestSpend | None = None) -> float:
        self._check_open()
        return self._spend.get((tenant, day), 0.0)

    async def add_spend(self, tenant: str, day: str, usd: float, amount_id: str = "") -> float:
        # Every call here is applied exactly once (no reply is ever lost): no id to check.
        return self.add_spend_now(tenant, day, usd)

    def add_spend_now(self, tenant: str, day: str, usd: float) -> float:
        """`add_spend` without an await: for a caller that must not yield (a cancelled call
        recording its cost)."""
        self._check_open()
        if day > self._day:  # a new UTC day: yesterday's totals are of no more use
            self._spend = {k: v for k, v in self._spend.items() if k[1] >= day}
            self._day = day
        total = self._spend.get((tenant, day), 0.0) + usd
        self._spend[(tenant, day)] = total
        return total

    async def repair(
        self, tenant: str, day: str, usd: float, *, spend: RequestSpend | None = None
    ) -> None:
        pass  # nothing here is ever unusable

    async def ping(self) -> None:
        self._check_open()

    async def aclose(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the quota store is closed")
