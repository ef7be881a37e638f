"""The process's background cache writes: shutdown waits for them, and cuts them at its bound
without leaving work that was never awaited."""

from __future__ import annotations

import asyncio
import gc
import warnings

from gateway.cache.background import BackgroundWrites


async def test_drain_waits_for_the_writes_sent_so_far() -> None:
    writes, done = BackgroundWrites(), []

    async def write() -> None:
        await asyncio.sleep(0.05)
        done.append(1)

    for _ in range(3):
        writes.spawn(write())
    await writes.drain(timeout_s=2.0)
    assert done == [1, 1, 1]


async def test_writes_cut_by_the_drains_bound_leave_nothing_unawaited() -> None:
    # Earlier tests' garbage (an unclosed client session, say) is freed before recording, so
    # only what this test leaves behind is looked at.
    gc.collect()
    writes, started = BackgroundWrites(), []

    async def write() -> None:
        started.append(1)
        await asyncio.sleep(10)

    with warnings.catch_warnings(record=True) as caught:
        # "coroutine ... was never awaited" is a RuntimeWarning raised when the coroutine is freed.
        warnings.simplefilter("always")
        writes.spawn(write())  # starts, then is cut by the drain's bound
        await asyncio.sleep(0)
        writes.spawn(write()).cancel()  # cut before it ever ran
        await writes.drain(timeout_s=0.05)
        gc.collect()
    assert started == [1]
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
