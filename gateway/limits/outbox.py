"""Spend kept in this process on its way to the shared quota store, until the store confirms it.

Every model call's cost is kept here at once (`keep`, no await: a cancellation cannot erase
it), then sent (`send`). While the store is down the spend waits, one sum per (tenant, day),
and goes back when the store answers again: with the next call's send, or with the health
probe's (`flush`). A sent amount keeps its id until the store confirms it, so a replay of an
amount that was in fact added, its reply lost, is not added twice (backends/quotas/redis.py).
Until then it counts as spent in this process's budget decisions (`outstanding`).

Amount ids are `<origin>:<seq>`: the store keeps each origin's latest seq per tenant and day,
so one (tenant, day)'s amounts are sent one at a time, in seq order, an unconfirmed one again
before any later one. Then a replay is told apart however many amounts other processes added
meanwhile, in one field per process.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.limits.shared_store import Key, SharedStore
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Ticket:
    """One amount kept: its (tenant, day) and its number among all amounts kept here."""

    key: Key
    number: int


class SpendOutbox:
    """One per process with a shared store."""

    def __init__(self, shared: SharedStore, metrics: Metrics) -> None:
        self._shared = shared
        self._metrics = metrics
        # Spend not yet sent is one sum per key; once sent, an amount keeps its id until the
        # store confirms it; while its reply is awaited it is in flight.
        self._pending: dict[Key, float] = {}
        self._unconfirmed: dict[Key, list[tuple[str, float]]] = {}
        self._in_flight: dict[Key, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._flushing: asyncio.Task[None] | None = None  # the probe's sends, in the background
        self._origin = secrets.token_hex(8)
        self._seq = 0
        self._senders: dict[Key, asyncio.Lock] = {}  # one send per key at a time
        # Amounts kept so far (a count, all keys), and per key that count when its latest
        # send that confirmed everything took the key's spend: a record kept before it
        # waited its turn for nothing (its amount went in that send). Else each record's
        # turn cost a round trip, and a busy tenant's records queued up without end.
        self._kept = 0
        self._confirmed: dict[Key, int] = {}

    def keep(self, key: Key, usd: float) -> Ticket:
        """Keep an amount here, without an await; `send` it next."""
        self._pending[key] = self._pending.get(key, 0.0) + usd
        self._kept += 1
        return Ticket(key, self._kept)

    async def send(self, ticket: Ticket) -> None:
        """Send the ticket's key's spend not yet in the store (ticket's amount included, unless
        a send that took it was confirmed meanwhile). Never raises: what the store does not
        confirm stays here, and counts as a spend decided here."""
        await self._flush_key(ticket.key, counted=True, kept=ticket.number)

    def send_nowait(self, ticket: Ticket) -> asyncio.Task[None]:
        """`send` in a task of its own (returned, for a caller that may wait for it). A send
        passes no request's Redis time budget: it runs after the answer."""
        return self._spawn(self.send(ticket))

    def outstanding(self) -> dict[Key, float]:
        """Spend not yet confirmed by the store, per key. An amount in flight or unconfirmed
        may be in the store's total already: counting it again errs towards refusing, for one
        round trip or until the replay confirms it."""
        out: dict[Key, float] = {}
        for key, usd in self._pending.items():
            out[key] = out.get(key, 0.0) + usd
        for key, batches in self._unconfirmed.items():
            out[key] = out.get(key, 0.0) + sum(usd for _, usd in batches)
        for key, usd in self._in_flight.items():
            out[key] = out.get(key, 0.0) + usd
        return {k: v for k, v in out.items() if v > 0}

    async def flush(self, wait_s: float) -> None:
        """Send everything kept here, waiting at most `wait_s`: one round trip per key, after a
        long outage with many tenants more than a health probe's timeout, which would report a
        store that answers as down and cut the sends half-way. The rest goes on in a task of
        its own; an unexpected exception in it is raised by the next call."""
        last = self._flushing
        if last is not None and last.done():
            self._flushing = None
            last.result()
        if self._flushing is None:
            self._flushing = self._spawn(self._flush_all())
        done, _ = await asyncio.wait({self._flushing}, timeout=wait_s)
        if done:
            self._flushing = None
            done.pop().result()

    async def aclose(self, timeout_s: float) -> None:
        """A bounded last try at sending what is kept here; what is left is logged per tenant
        (it is lost: the fleet's total for the day under-counts it)."""
        try:
            async with asyncio.timeout(timeout_s):
                if self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
                self._shared.reopen()  # one last try, even within the retry interval
                await self._flush_all()
        except TimeoutError:
            pass
        for task in self._tasks:
            task.cancel()
        for (tenant, day), usd in sorted(self.outstanding().items()):
            log.warning(
                "spend not added to the quota store at shutdown",
                extra={"tenant": tenant, "day": day, "usd": usd, "store": self._shared.name},
            )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _flush_all(self) -> None:
        for key in sorted(set(self._pending) | set(self._unconfirmed)):
            if not await self._flush_key(key, counted=False):
                return

    async def _flush_key(self, key: Key, *, counted: bool, kept: int | None = None) -> bool:
        """Send the key's spend not yet in the shared store: amounts already sent once with
        their ids, the rest as one new amount. True when all of it is confirmed. `counted`:
        a model call's cost that stays here counts as one local decision. One send per key
        at a time (the ids' order: see the module's docstring); spend kept meanwhile waits
        and goes in the next one, as one amount. `kept`: the number of the amount this call
        is for; when a send that took it is confirmed while this one waits, there is nothing
        to do."""
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

    async def _send_in_order(self, key: Key, *, counted: bool) -> bool:
        store = self._shared.store
        tenant, day = key
        if self._shared.skipped():
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
                total = await self._shared.ask(
                    lambda: store.add_spend(tenant, day, amount, amount_id),  # noqa: B023
                    tenant,
                    day,
                )
                if total is None:
                    break  # none later is sent before this one is confirmed
                self._shared.seen(key, total)
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
