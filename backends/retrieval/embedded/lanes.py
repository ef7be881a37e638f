"""Read lanes: the embedded index's reads on a bounded pool of threads, one lane per tenant.

A tenant's reads run one at a time, in the order they came (its lane is a FIFO lock), so one
tenant's slow searches queue behind each other and never in front of another tenant's: a
tenant holds at most one of the pool's threads, and the pool's own FIFO queue holds at most one
read per tenant, so a read waits for a thread behind at most one read of each other busy tenant.
Each call takes an idle connection (one per thread at most) for its duration (WAL: readers never
block each other or the writer). One lane per tenant is also what lets a tenant's vectors in
memory go unlocked (see `state`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")


@dataclass
class _Lane:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holding or waiting for the lock: the lane is dropped at 0


class ReadLanes(Generic[R]):
    """`readers` threads, each lending a resource `open_one` made (a connection), per-tenant lanes.

    Used from one event loop."""

    def __init__(
        self, readers: int, open_one: Callable[[], R], close_one: Callable[[R], None]
    ) -> None:
        if readers < 1:
            raise ValueError(f"readers must be at least 1, not {readers}")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=readers, thread_name_prefix="embedded-read"
        )
        self._open_one = open_one
        self._close_one = close_one
        self._idle: queue.SimpleQueue[R] = queue.SimpleQueue()
        self._opened: list[R] = []
        self._opening = threading.Lock()
        self._lanes: dict[str, _Lane] = {}

    async def run(self, tenant: str | None, fn: Callable[[R], T]) -> T:
        """`fn(resource)` on a read thread, after the tenant's earlier reads (None: no lane).

        The lane is left when the thread is done, not when the caller stops waiting: a
        cancelled read that already runs keeps its tenant's next read waiting until it ends."""
        loop = asyncio.get_running_loop()
        held = None if tenant is None else (tenant, await self._enter(tenant))
        try:
            work = self._pool.submit(self._lend, fn)
        except BaseException:
            if held is not None:
                self._leave(*held)
            raise
        if held is not None:
            left = partial(loop.call_soon_threadsafe, self._leave, *held)
            work.add_done_callback(lambda _: left())
        return await asyncio.wrap_future(work)

    def waiting(self, tenant: str) -> int:
        """The tenant's reads running or queued in its lane."""
        lane = self._lanes.get(tenant)
        return 0 if lane is None else lane.users

    def close(self) -> None:
        """Wait for running reads, then close every resource; after the last `run`."""
        self._pool.shutdown(wait=True)
        for resource in self._opened:
            self._close_one(resource)
        self._opened.clear()

    async def _enter(self, tenant: str) -> _Lane:
        lane = self._lanes.setdefault(tenant, _Lane())
        lane.users += 1
        try:
            await lane.lock.acquire()
        except BaseException:
            self._drop(tenant, lane)
            raise
        return lane

    def _leave(self, tenant: str, lane: _Lane) -> None:
        lane.lock.release()
        self._drop(tenant, lane)

    def _drop(self, tenant: str, lane: _Lane) -> None:
        lane.users -= 1
        if not lane.users:
            del self._lanes[tenant]

    def _lend(self, fn: Callable[[R], T]) -> T:
        try:
            resource = self._idle.get_nowait()
        except queue.Empty:
            # At most one per thread: a thread returns its resource before its next call.
            resource = self._open_one()
            with self._opening:
                self._opened.append(resource)
        try:
            return fn(resource)
        finally:
            self._idle.put(resource)
