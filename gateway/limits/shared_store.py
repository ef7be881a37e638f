"""The shared quota store (Redis) as one process reaches it: asked until it fails, then skipped.

Unreachable or too slow (`BackendUnavailable`): the whole store is down. It is not asked again
for `retry_s` (an outage costs one timeout per interval), then one call asks it while the others
decide without it (half-open); the first answer, or the health probe (`ping`), ends the outage.
`querygate_quota_store_degraded` and one warning per outage say so. Any other error is one
tenant's keys holding something unusable: logged, repaired from the last total the store gave,
and that one decision made without it. The totals it gave are kept per (tenant, day), for the
budget decisions made while it is down. A request's calls pass its `spend` (its Redis time
budget, `backends.redis_client`) to the repair too; a call past that budget is the request's
doing and is not a verdict on the store's health. A sent call cut by it may be a slow store
or a busy loop, so one probe (`ping`, in a task of its own) settles which: the store's ping
judges the store alone, and fails when it is unreachable or slower than a request's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from backends.errors import BackendError, BackendUnavailable
from backends.quotas.base import QuotaStore
from backends.redis_client import RequestBudgetSpent, RequestSpend
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# (tenant id, UTC day): what a day's spend is kept by.
Key = tuple[str, str]


def utc_day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")


class SharedStore:
    """One per process, around the `QuotaStore` every replica shares."""

    def __init__(
        self,
        store: QuotaStore,
        metrics: Metrics,
        *,
        retry_s: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._metrics = metrics
        self.retry_s = retry_s
        self._clock = clock
        self._monotonic = monotonic
        self._retry_at = 0.0  # monotonic time before which the store is not asked
        self.degraded = False
        self._last_seen: dict[Key, float] = {}
        self._confirming: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def name(self) -> str:
        return self.store.name

    def skipped(self) -> bool:
        """Whether the store is not asked now (within the retry interval of a failure)."""
        return self._monotonic() < self._retry_at

    def reopen(self) -> None:
        """Ask the store on the next call, even within the retry interval."""
        self._retry_at = 0.0

    def seen(self, key: Key, total: float) -> None:
        """Note a day's total the store gave."""
        if key not in self._last_seen and self._last_seen:
            # A new (tenant, day): drop totals of days that are over.
            self._last_seen = {k: v for k, v in self._last_seen.items() if k[1] >= key[1]}
        self._last_seen[key] = max(total, self._last_seen.get(key, 0.0))

    def last_seen(self, key: Key) -> float | None:
        """The highest total the store gave this process for this (tenant, day); None when it
        never gave one (the process started, or the day began, while it was down)."""
        return self._last_seen.get(key)

    async def ask(
        self,
        call: Callable[[], Awaitable[T]],
        tenant: str,
        day: str | None = None,
        *,
        spend: RequestSpend | None = None,
    ) -> T | None:
        """The store's answer to `call`, or None: skipped, down, or this tenant's keys unusable
        (then repaired). `spend`: the request's `call` is made for, which the repair passes
        on too (None: work no answer waits for)."""
        now = self._monotonic()
        if now < self._retry_at:
            return None
        if self.degraded:
            # Half-open: this call alone asks the store that was down; the calls that arrive
            # while it waits for its answer (a slow Redis: up to a timeout) decide here,
            # rather than each paying that timeout too.
            self._retry_at = now + self.retry_s
        try:
            result = await call()
        except RequestBudgetSpent as exc:
            # This request's own outcome: the store's state stands for the others, unless
            # the probe a cut call starts finds the store down.
            if exc.cut:
                self._confirm()
            return None
        except BackendUnavailable as exc:
            self._down(exc)
            return None
        except BackendError as exc:
            await self._repair(tenant, day or utc_day(self._clock()), exc, spend)
            return None
        self._up()
        return result

    async def ping(self) -> None:
        """Probe the store: ends the outage once it answers. Raises BackendError while it is
        unreachable."""
        try:
            await self.store.ping()
        except BackendUnavailable as exc:
            self._down(exc)
            raise
        self._up()

    async def settled(self) -> None:
        """Wait for the verdict of the probe a cut call started, if one is running."""
        if self._confirming is not None:
            await asyncio.wait([self._confirming])

    async def aclose(self) -> None:
        """No probe starts after this; the running one is cancelled (waited for without
        taking its cancellation for this call's own)."""
        self._closed = True
        if self._confirming is not None:
            self._confirming.cancel()
            await asyncio.wait([self._confirming])
        await self.store.aclose()

    def _confirm(self) -> None:
        """Probe the store in the background, one probe at a time: its failure marks the
        store down (`ping`), its answer leaves it up."""
        if self._closed:
            return
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.create_task(self._probe())

    async def _probe(self) -> None:
        with contextlib.suppress(BackendError):
            await self.ping()

    async def _repair(
        self, tenant: str, day: str, exc: BackendError, spend: RequestSpend | None
    ) -> None:
        usd = self.last_seen((tenant, day)) or 0.0
        log.warning(
            "a tenant's quota keys are unusable: repaired, this decision made here",
            extra={"tenant": tenant, "store": self.name, "error": str(exc), "usd": usd},
        )
        try:
            await self.store.repair(tenant, day, usd, spend=spend)
        except BackendError as failed:
            log.warning("quota keys not repaired", extra={"tenant": tenant, "error": str(failed)})

    def _down(self, exc: BackendError) -> None:
        self._retry_at = self._monotonic() + self.retry_s
        if not self.degraded:
            self.degraded = True
            self._metrics.quota_store_degraded.set(1)
            log.warning(
                "quota store unavailable: rate limits and budgets are enforced per "
                "process until it is back",
                extra={"store": self.name, "error": str(exc)},
            )

    def _up(self) -> None:
        self._retry_at = 0.0
        if self.degraded:
            self.degraded = False
            self._metrics.quota_store_degraded.set(0)
            log.warning("quota store back: rate limits and budgets are shared again")
