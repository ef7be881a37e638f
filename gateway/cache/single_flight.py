"""One computation for concurrent identical misses, in this process and across the fleet.

In a process, the first request to miss a key leads: it holds a future that the others with
the same key await. Across processes, the leader also holds the store's claim on the key
(`CacheStore.claim`, a lease that ends at release or after its TTL); a request in another
process that finds the claim taken polls the store for the answer, retrying the claim as it
goes, so it leads itself when the leader released without storing anything (an answer that
may not be cached, a failure). Nobody waits longer than `single_flight_wait_s` nor past the
request's deadline; then it computes the answer itself. A store that fails while claiming is a
store that is down: the request computes, uncoordinated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from backends.cache.base import CacheStore
from backends.errors import BackendError
from gateway.guard import request_deadline

# How often a waiter in another process looks for the leader's answer.
POLL_INTERVAL_S = 0.05

Payload = dict[str, Any]


@dataclass(slots=True)
class Shared:
    """What a leader hands to its in-process followers: the cached form and its tier."""

    payload: Payload
    tier: str


@dataclass(slots=True)
class Lease:
    tenant: str
    key: str
    future: asyncio.Future[Shared | None]
    claimed: bool = False  # holds the store's claim too
    done: bool = False


class SingleFlight:
    def __init__(self, store: CacheStore, wait_s: float, lease_s: float) -> None:
        self._store = store
        self._wait_s = wait_s
        self._lease_s = lease_s
        self._flights: dict[tuple[str, str], Lease] = {}

    def leader_of(self, tenant: str, key: str) -> Lease | None:
        return self._flights.get((tenant, key))

    def budget_s(self) -> float:
        """How long a follower may wait: the configured wait, never past its deadline."""
        wait = self._wait_s
        deadline = request_deadline.get()
        if deadline is not None:
            wait = min(wait, deadline - asyncio.get_running_loop().time())
        return max(0.0, wait)

    async def follow(self, lease: Lease) -> Shared | None:
        """The in-process leader's answer, or None (it could not share one, or took too long)."""
        try:
            async with asyncio.timeout(self.budget_s()):
                return await asyncio.shield(lease.future)
        except TimeoutError:
            return None

    async def lead(
        self, tenant: str, key: str, poll: Callable[[], Awaitable[Payload | None]]
    ) -> tuple[Lease, Payload | None]:
        """Lead the key's computation in this process, and across processes when the store's
        claim is free. When another process holds it, poll (`poll()` returns the stored
        answer or None) until its answer is stored (returned with the lease, which the caller
        finishes with it), the claim comes free (this request leads), or the wait is over
        (this request computes, leading only this process's followers). Errors from the store
        end the lead at once and propagate."""
        lease = self._register(tenant, key)
        try:
            lease.claimed = await self._store.claim(tenant, key, self._lease_s)
            if lease.claimed:
                return lease, None
            loop = asyncio.get_running_loop()
            until = loop.time() + self.budget_s()
            while (left := until - loop.time()) > 0:
                await asyncio.sleep(min(POLL_INTERVAL_S, left))
                if (payload := await poll()) is not None:
                    return lease, payload
                if await self._store.claim(tenant, key, self._lease_s):
                    lease.claimed = True
                    # The leader may have stored its answer and released between the two
                    # reads: look once more before computing it again.
                    return lease, await poll()
            return lease, None
        except BaseException:
            await self.finish(lease, None)
            raise

    async def finish(self, lease: Lease | None, shared: Shared | None) -> None:
        """End a lead: followers get `shared` (None: they compute), the claim is released.
        Idempotent, and safe in a `finally` of a cancelled request."""
        if lease is None or lease.done:
            return
        lease.done = True
        if self._flights.get((lease.tenant, lease.key)) is lease:
            del self._flights[(lease.tenant, lease.key)]
        if not lease.future.done():
            lease.future.set_result(shared)
        if lease.claimed:
            # Shielded: a request cancelled meanwhile still gives the claim back.
            with contextlib.suppress(BackendError):
                await asyncio.shield(self._store.release(lease.tenant, lease.key))

    def _register(self, tenant: str, key: str) -> Lease:
        future: asyncio.Future[Shared | None] = asyncio.get_running_loop().create_future()
        lease = Lease(tenant, key, future)
        self._flights[(tenant, key)] = lease
        return lease
