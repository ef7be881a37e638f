"""Admission pools: caps, bounded waiting, fair share, deadlines, refusals at once."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import DeadlineExceeded
from gateway.limits.admission import Pool, Saturated, TenantOverShare
from gateway.obs.metrics import Metrics
from gateway.settings import AdmissionConfig, PoolLimits
from tests.metrics import Scrape

CONFIG = AdmissionConfig(max_queue_wait_s=5, retry_after_s=2)


def limits(
    inflight: int = 2, queued: int = 4, t_inflight: int = 1, t_queued: int = 2
) -> PoolLimits:
    return PoolLimits(
        max_inflight=inflight,
        max_queued=queued,
        tenant_max_inflight=t_inflight,
        tenant_max_queued=t_queued,
    )


def later(s: float = 10.0) -> float:
    return asyncio.get_running_loop().time() + s


class Held:
    """A request that holds its slot until released; `ran` says it was admitted."""

    def __init__(self, pool: Pool, tenant: str, lim: PoolLimits, deadline: float | None = None):
        self.ran = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.ensure_future(self._run(pool, tenant, lim, deadline))

    async def _run(self, pool: Pool, tenant: str, lim: PoolLimits, deadline: float | None) -> None:
        async with pool.admit(tenant, deadline or later(), lim, CONFIG):
            self.ran.set()
            await self.release.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_tenant_over_its_share_gets_429_at_once_with_retry_after() -> None:
    pool, lim = Pool("queries"), limits(t_queued=1)
    running, waiting = Held(pool, "a", lim), Held(pool, "a", lim)
    await settle()
    assert running.ran.is_set() and not waiting.ran.is_set()
    with pytest.raises(TenantOverShare) as refused:
        await asyncio.wait_for(pool._acquire("a", later(), lim, CONFIG), 0.1)
    assert refused.value.status == 429 and refused.value.retry_after_s == 2
    # Another tenant still runs at once: the process has room.
    other = Held(pool, "b", lim)
    await settle()
    assert other.ran.is_set()
    for h in (running, waiting, other):
        h.release.set()
    await asyncio.gather(running.task, waiting.task, other.task)
    assert (pool.running, pool.queued) == (0, 0)


async def test_a_full_process_gets_503_and_a_light_tenant_pushes_out_a_heavy_ones_waiter() -> None:
    pool, lim = Pool("queries"), limits(inflight=2, queued=2, t_inflight=2, t_queued=2)
    heavy = [Held(pool, "a", lim) for _ in range(4)]  # two run, two wait: the room is full
    await settle()
    assert [h.ran.is_set() for h in heavy] == [True, True, False, False]
    light = Held(pool, "b", lim)  # takes the place of a's newest waiter
    await settle()
    with pytest.raises(TenantOverShare):
        await heavy[3].task
    with pytest.raises(Saturated) as refused:  # queues a:1, b:1 — nobody to push out
        await pool._acquire("c", later(), lim, CONFIG)
    assert refused.value.status == 503 and refused.value.retry_after_s == 2
    for h in (*heavy[:3], light):
        h.release.set()
    await asyncio.gather(*(h.task for h in (*heavy[:3], light)))
    assert (pool.running, pool.queued) == (0, 0)


async def test_freed_slots_go_to_tenants_in_turn() -> None:
    pool, lim = Pool("queries"), limits(inflight=1, queued=8, t_inflight=1, t_queued=4)
    first = Held(pool, "a", lim)
    await settle()
    a_waiting = [Held(pool, "a", lim) for _ in range(3)]
    b_waiting = Held(pool, "b", lim)
    await settle()
    order: list[str] = []
    first.release.set()
    await first.task
    for _ in range(4):
        await settle()
        ran = next(h for h in (*a_waiting, b_waiting) if h.ran.is_set() and not h.release.is_set())
        order.append("b" if ran is b_waiting else "a")
        ran.release.set()
        await ran.task
    assert order == ["a", "b", "a", "a"]


async def test_a_waiter_whose_deadline_passes_is_dropped_before_it_runs() -> None:
    pool, lim = Pool("writes"), limits(inflight=1, t_inflight=1)
    running = Held(pool, "a", lim)
    await settle()
    doomed = Held(pool, "b", lim, deadline=later(0.05))
    with pytest.raises(DeadlineExceeded):
        await doomed.task
    assert not doomed.ran.is_set() and pool.queued == 0
    with pytest.raises(DeadlineExceeded):  # already past: refused without waiting
        await pool._acquire("b", later(-1), lim, CONFIG)
    running.release.set()
    await running.task
    assert (pool.running, pool.queued) == (0, 0)


async def test_a_wait_is_bounded_by_max_queue_wait() -> None:
    pool, lim = Pool("queries"), limits(inflight=1, t_inflight=1)
    running = Held(pool, "a", lim)
    await settle()
    config = AdmissionConfig(max_queue_wait_s=0.05)
    with pytest.raises(Saturated):
        await pool._acquire("b", later(), lim, config)
    assert pool.queued == 0
    running.release.set()
    await running.task


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    pool, lim = Pool("queries"), limits(inflight=1, t_inflight=1)
    running = Held(pool, "a", lim)
    await settle()
    gone = Held(pool, "b", lim)
    await settle()
    assert pool.queued == 1
    gone.task.cancel()
    await settle()
    assert pool.queued == 0
    running.release.set()
    await running.task
    assert (pool.running, pool.queued) == (0, 0)


async def test_raised_limits_dispatch_waiters_at_once() -> None:
    pool, lim = Pool("queries"), limits(inflight=1, t_inflight=1)
    running = Held(pool, "a", lim)
    waiting = Held(pool, "b", lim)
    await settle()
    assert not waiting.ran.is_set()
    pool.configure(limits(inflight=2, t_inflight=1), CONFIG)  # a reload; nobody finished
    await settle()
    assert waiting.ran.is_set() and (pool.running, pool.queued) == (2, 0)
    for h in (running, waiting):
        h.release.set()
    await asyncio.gather(running.task, waiting.task)


async def test_the_gauges_follow_every_change_of_the_queue() -> None:
    metrics = Metrics()
    pool, lim = Pool("writes", metrics), limits(inflight=1, queued=2, t_inflight=1, t_queued=2)

    def gauges() -> tuple[float | None, float | None]:
        scrape = Scrape.of(metrics)
        return (
            scrape.get("querygate_admission_inflight", pool="writes"),
            scrape.get("querygate_admission_queued", pool="writes"),
        )

    running = Held(pool, "a", lim)
    heavy = [Held(pool, "a", lim) for _ in range(2)]
    await settle()
    assert gauges() == (1, 2)
    pool._push_out("b")  # a's newest waiter makes room (what a newcomer does)
    assert gauges() == (1, 1)
    pool._prune(later(60))  # a's other waiter is past its deadline
    assert gauges() == (1, 0) and pool.queued == 0
    for h in heavy:
        with pytest.raises((TenantOverShare, DeadlineExceeded)):
            await h.task
    running.release.set()
    await running.task
    assert gauges() == (0, 0)
