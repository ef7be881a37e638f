"""The quota-store seam: per-tenant request rate and daily spend, shared by every process
that shares the store (Redis), or held per process (memory).

The gateway decides the limits and what a refusal looks like (gateway/limits/quotas.py); a
store only keeps the counters, each update atomic. Errors raise `BackendError`:
`BackendUnavailable` when the store cannot be reached or is too slow (the whole store is down),
any other `BackendError` when one tenant's keys hold something unusable (that tenant only:
`repair` fixes them).

The calls a request waits for (`take`, `take_and_spent`, `spent`, `repair`) take the request's
`spend`: a remote store bounds them, with every other call made for the request, by its shared
time budget (`backends.redis_client`). None: work no answer waits for. `add_spend` is only
sent after the answer, in a task of its own (or by the health probe), and takes none.
"""

from __future__ import annotations

from typing import Protocol

from backends.redis_client import RequestSpend


class QuotaStore(Protocol):
    name: str

    async def take(
        self, tenant: str, rate_per_s: float, burst: float, *, spend: RequestSpend | None = None
    ) -> float:
        """Take one token from the tenant's bucket (refilled at `rate_per_s`, holding at most
        `burst`). Returns 0.0 when taken, else the seconds until one will be there."""
        ...

    async def take_and_spent(
        self,
        tenant: str,
        rate_per_s: float,
        burst: float,
        day: str,
        *,
        spend: RequestSpend | None = None,
    ) -> tuple[float, float]:
        """`take`, then `spent` on `day`, in one step (one round trip to a remote store): a
        request's rate limit and budget, checked as it arrives."""
        ...

    async def spent(self, tenant: str, day: str, *, spend: RequestSpend | None = None) -> float:
        """USD the tenant has spent on `day` (UTC, YYYY-MM-DD)."""
        ...

    async def add_spend(self, tenant: str, day: str, usd: float, amount_id: str) -> float:
        """Add `usd` to the tenant's spend on `day` unless the amount `amount_id` was added
        already (a replay after a reply that never came); returns the day's total.
        `amount_id` is `<origin>:<seq>`: a process's amounts of one (tenant, day) are sent in
        the order of `seq` and an unconfirmed one again before any later one, so a store may
        keep only each origin's latest `seq`. "": the amount is added every time it is sent."""
        ...

    async def repair(
        self, tenant: str, day: str, usd: float, *, spend: RequestSpend | None = None
    ) -> None:
        """Fix the tenant's keys that hold something unusable: a bucket is started afresh, a
        day's spend that is not a number is set to `usd` (the last total the caller saw)."""
        ...

    async def ping(self) -> None:
        """Raises `BackendUnavailable` when the store cannot be reached, or answers too slowly
        for a request to wait on it (a remote store's verdict on itself, apart from this
        process's own load)."""
        ...

    async def aclose(self) -> None: ...
