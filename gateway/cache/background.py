"""Work no answer waits for: cache writes and claim releases, sent after the answer.

One per process (`PROCESS_WRITES`), shared by every pipeline (a reload builds a new one while
the old one's writes are still going), so that shutdown can wait for them before the store's
connection closes: else an answer computed and paid for is not stored, and its claim holds up
the key in every other replica until the lease ends. The work passes no request's Redis time
budget (`backends.redis_client.RequestSpend`): it would eat into it, or find it spent and fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

# At shutdown, how long the last writes get before they are cut (the quotas' spend gets as
# long, gateway/limits/quotas.py).
DRAIN_S = 2.0


class BackgroundWrites:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` in a task of its own."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the work sent so far (and what it sends); past `timeout_s`, cut it."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._tasks:
                    await asyncio.gather(*list(self._tasks), return_exceptions=True)
        except TimeoutError:
            log.warning("cache writes cut at shutdown", extra={"writes": len(self._tasks)})
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


PROCESS_WRITES = BackgroundWrites()
