"""The supervisor's pauses before a replacement stay at 30 s however long a loop goes on:
a crash loop or a worker that cannot start is retried for as long as the others serve."""

from __future__ import annotations

import multiprocessing
import socket
import time

from gateway.server.run import run_worker
from gateway.server.workers import Supervisor, WorkerSpec, _Worker
from gateway.settings import Settings


def _supervisor(sock: socket.socket) -> Supervisor:
    return Supervisor(WorkerSpec(None, None, 0, "INFO", Settings()), sock, 2, 0.0, run_worker)


def test_a_crash_loop_hours_long_still_waits_30_s() -> None:
    with socket.socket() as sock:
        supervisor = _supervisor(sock)
        # ~9 hours of serving workers dying every 30 s: 2.0 ** 1100 overflowed a float
        supervisor._last_crash, supervisor._crash_streak = time.monotonic(), 1100
        supervisor._replace_crashed()
        assert [round(t - time.monotonic()) for t, _ in supervisor._respawn_at] == [30]


def test_a_worker_failing_to_start_for_hours_still_waits_30_s() -> None:
    with socket.socket() as sock:
        supervisor = _supervisor(sock)
        context = multiprocessing.get_context("spawn")
        serving = context.Event()
        serving.set()  # the other worker serves
        supervisor._workers[1] = _Worker(context.Process(target=print), serving, served=True)
        supervisor._counts = [1, 2]  # the shared [serving, expected]
        supervisor._any_ready, supervisor._early_exits = True, 1100
        assert supervisor._replace_failed_start(1, 30.0) is None  # retried, not fatal
        assert [round(t - time.monotonic()) for t, _ in supervisor._respawn_at] == [30]
