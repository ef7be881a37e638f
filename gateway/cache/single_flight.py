"""One computation for concurrent identical misses, in this process and across the fleet.

In a process, the first request to miss a key leads: it holds a future that the others with
the same key await. Across processes, the leader also holds the store's claim on the key
(`CacheStore.claim`, a lease that ends at release or after its TTL); a request in another
process that finds the claim taken polls the store for the answer, retrying the claim as it
goes, so it leads itself when the leader released without storing anything (an answer that
may not be cached, a failure). A store that fails while claiming is a store that is down: the
request computes, uncoordinated. A request with no leader in its process looks the key up and
claims it in one call to the store (`look_and_lead`, one Redis script: a miss costs one round
trip, not two); it leads this process from before that call, and a hit hands its answer to the
requests that came meanwhile.

The store's claim is short (`LEASE_S`) and the leader renews it every third of that while it
computes, so a leader that died (a killed process) holds up a popular question for seconds,
not for a whole request timeout. A follower waits no longer than `single_flight_wait_s` and
never past half of what is left of its own deadline (the `deadline` its caller passes, a loop
time): the other half is left to compute the answer itself. An in-process lead older than the
request timeout (a leader whose request never reached `finish`) is dropped, not followed.

A lead's first lookup and claim pass the request's `spend` (its Redis time budget,
`backends.redis_client`); a follower's polls and claims do not (its wait has its own bound,
`budget_s`), nor do the renewals and releases, which run in tasks of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from backends.cache.base import CacheStore
from backends.errors import BackendError
from backends.redis_client import RequestSpend
from gateway.cache.background import PROCESS_WRITES

# How often a waiter in another process looks for the leader's answer.
POLL_INTERVAL_S = 0.05
# The store's claim: how long it outlives a leader that stopped renewing it.
LEASE_S = 6.0
# The share of a follower's remaining deadline it may spend waiting for a leader.
WAIT_SHARE = 0.5
# How often a lookup-and-claim given up is abandoned again while the store fails.
ABANDON_RETRY_S = 0.25

Payload = dict[str, Any]
# The tier a cached answer was found in.
HitTier = Literal["exact", "semantic"]


@dataclass(slots=True)
class Shared:
    """What a leader hands to its in-process followers: the cached form and its tier."""

    payload: Payload
    tier: HitTier


@dataclass(slots=True)
class Lease:
    tenant: str
    key: str
    future: asyncio.Future[Shared | None]
    claimed: bool = False  # holds the store's claim too
    done: bool = False
    started: float = 0.0  # loop time
    renewing: asyncio.Task[None] | None = None


class SingleFlight:
    def __init__(
        self, store: CacheStore, wait_s: float, lease_s: float, stale_s: float | None = None
    ) -> None:
        self._store = store
        self._wait_s = wait_s
        self._lease_s = lease_s
        # An in-process lead this old is dropped (default: ten leases).
        self._stale_s = stale_s if stale_s is not None else 10 * lease_s
        self._flights: dict[tuple[str, str], Lease] = {}
        # Work no answer waits for: cache writes (by key, so a claim is released only once
        # its answer is stored) and claim releases; the process's, so shutdown waits for it.
        self.writes: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Keys whose lookup-and-claim raised, to abandon (`_give_up`), and when.
        self._given_up: dict[tuple[str, str], float] = {}
        self._abandoning: asyncio.Task[None] | None = None

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return PROCESS_WRITES.spawn(work)

    async def drain(self) -> None:
        """Wait for the process's writes and releases sent so far (tests)."""
        await PROCESS_WRITES.drain()

    def leader_of(self, tenant: str, key: str) -> Lease | None:
        lease = self._flights.get((tenant, key))
        if lease is not None and asyncio.get_running_loop().time() - lease.started > self._stale_s:
            # Its request never finished it (a bug, a leak): nobody follows it any more.
            del self._flights[(tenant, key)]
            if not lease.future.done():
                lease.future.set_result(None)
            return None
        return lease

    def budget_s(self, deadline: float | None = None) -> float:
        """How long a follower may wait: the configured wait, and never more than a share of
        what is left of its `deadline` (the rest is for computing the answer itself)."""
        wait = self._wait_s
        if deadline is not None:
            wait = min(wait, WAIT_SHARE * (deadline - asyncio.get_running_loop().time()))
        return max(0.0, wait)

    async def follow(self, lease: Lease, *, deadline: float | None = None) -> Shared | None:
        """The in-process leader's answer, or None (it could not share one, or took too long)."""
        try:
            async with asyncio.timeout(self.budget_s(deadline)):
                return await asyncio.shield(lease.future)
        except TimeoutError:
            return None

    async def lead(
        self,
        tenant: str,
        key: str,
        poll: Callable[[], Awaitable[Payload | None]],
        *,
        deadline: float | None = None,
        spend: RequestSpend | None = None,
    ) -> tuple[Lease, Payload | None]:
        """Lead the key's computation in this process, and across processes when the store's
        claim is free. When another process holds it, poll (`poll()` returns the stored
        answer or None) until its answer is stored (returned with the lease, which the caller
        finishes with it), the claim comes free (this request leads), or the wait is over
        (this request computes, leading only this process's followers). Errors from the store
        end the lead at once and propagate. `spend`: the request's, for the first claim; `poll`
        passes none (see `_claimed_or_wait`)."""
        lease = self._register(tenant, key)
        try:
            claimed = await self._store.claim(tenant, key, self._lease_s, spend=spend)
            return lease, await self._claimed_or_wait(lease, claimed, poll, deadline)
        except BaseException:
            await self.finish(lease, None)
            raise

    async def look_and_lead(
        self,
        tenant: str,
        key: str,
        look: Callable[[], Awaitable[tuple[Payload | None, bool | None]]],
        poll: Callable[[], Awaitable[Payload | None]],
        *,
        deadline: float | None = None,
        spend: RequestSpend | None = None,
    ) -> tuple[Lease | None, Payload | None]:
        """`lead`, with the key's lookup and the store's claim in one call: `look()` returns
        the stored answer, or None and whether the claim was taken (None: not tried, as when
        the store found an entry it could not serve; it is claimed then). A hit ends the lead
        at once (no lease returned) and hands the answer to the followers that came
        meanwhile. The lead is this process's from before the call, as it is from before the
        claim in `lead`: a request for the same key arriving meanwhile follows it. `look`
        passes the request's `spend`, as the claim after it does."""
        lease = self._register(tenant, key)
        try:
            try:
                payload, claimed = await look()
            except BaseException:
                # Its reply never came, but the store may have run it and claimed: given up
                # (not left to hold the key from every process for a lease).
                self._give_up(tenant, key)
                raise
            if payload is not None:
                await self.finish(lease, Shared(payload, "exact"))
                return None, payload
            if claimed is None:
                claimed = await self._store.claim(tenant, key, self._lease_s, spend=spend)
            return lease, await self._claimed_or_wait(lease, claimed, poll, deadline)
        except BaseException:
            await self.finish(lease, None)
            raise

    @property
    def lease_s(self) -> float:
        """The store's claim's lease (renewed while its leader computes)."""
        return self._lease_s

    async def _claimed_or_wait(
        self,
        lease: Lease,
        claimed: bool,
        poll: Callable[[], Awaitable[Payload | None]],
        deadline: float | None,
    ) -> Payload | None:
        """After the first claim: keep it when taken, else wait for the claim's holder in
        another process (see `lead`). Returns the answer found stored, or None."""
        lease.claimed = claimed
        if lease.claimed:
            self._keep(lease)
            return None
        loop = asyncio.get_running_loop()
        until = loop.time() + self.budget_s(deadline)
        # The wait is bounded by `until`, not by the request's Redis time budget (its polls
        # and claims pass none): two calls every 50 ms spend 0.25 s in ~3 s at a 2 ms round
        # trip, and the follower would give up on the leader (computing the answer again,
        # uncached).
        while (left := until - loop.time()) > 0:
            await asyncio.sleep(min(POLL_INTERVAL_S, left))
            if (payload := await poll()) is not None:
                return payload
            if await self._store.claim(lease.tenant, lease.key, self._lease_s):
                lease.claimed = True
                self._keep(lease)
                # The leader may have stored its answer and released between the two
                # reads: look once more before computing it again.
                return await poll()
        return None

    async def finish(self, lease: Lease | None, shared: Shared | None) -> None:
        """End a lead: followers get `shared` (None: they compute), the claim is released.
        Idempotent, and safe in a `finally` of a cancelled request."""
        if lease is None or lease.done:
            return
        lease.done = True
        if lease.renewing is not None:
            lease.renewing.cancel()
        if self._flights.get((lease.tenant, lease.key)) is lease:
            del self._flights[(lease.tenant, lease.key)]
        if not lease.future.done():
            lease.future.set_result(shared)
        if lease.claimed:
            # In a task of its own, after the key's answer is stored (a follower in another
            # process that found the claim free before the answer would compute it again):
            # nobody waits for it, and a request cancelled meanwhile still gives it back.
            self.spawn(self._release(lease.tenant, lease.key))

    def _give_up(self, tenant: str, key: str) -> None:
        """Queue the key's lookup-and-claim for `CacheStore.abandon`, sent by one task of
        the process's, one call at a time: a Redis outage fails every lookup, and a task per
        lookup retrying would take the connections the requests need."""
        self._given_up[(tenant, key)] = asyncio.get_running_loop().time()
        if self._abandoning is None or self._abandoning.done():
            self._abandoning = self.spawn(self._abandon_all())

    async def _abandon_all(self) -> None:
        """Abandon the queued keys, again every ABANDON_RETRY_S while the store fails; a key
        queued a lease ago is dropped (a claim it took has lapsed by itself)."""
        loop = asyncio.get_running_loop()
        while self._given_up:
            for (tenant, key), since in list(self._given_up.items()):
                if loop.time() - since < self._lease_s:
                    try:
                        await self._store.abandon(tenant, key)
                    except BackendError:
                        break
                if self._given_up.get((tenant, key)) == since:
                    del self._given_up[(tenant, key)]
            else:
                continue
            await asyncio.sleep(ABANDON_RETRY_S)

    async def _release(self, tenant: str, key: str) -> None:
        if (write := self.writes.get((tenant, key))) is not None:
            await asyncio.gather(write, return_exceptions=True)
        with contextlib.suppress(BackendError):
            await self._store.release(tenant, key)

    def _register(self, tenant: str, key: str) -> Lease:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Shared | None] = loop.create_future()
        lease = Lease(tenant, key, future, started=loop.time())
        self._flights[(tenant, key)] = lease
        return lease

    def _keep(self, lease: Lease) -> None:
        """Renew the store's claim every third of its life until the lead is finished."""
        lease.renewing = asyncio.get_running_loop().create_task(self._renew(lease))

    async def _renew(self, lease: Lease) -> None:
        while not lease.done:
            await asyncio.sleep(self._lease_s / 3)
            try:
                if not await self._store.renew(lease.tenant, lease.key, self._lease_s):
                    return  # lost (expired and taken): another request leads the fleet now
            except BackendError:
                continue  # the store is failing: the claim may lapse, which only costs time
