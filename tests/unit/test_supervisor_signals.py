"""The supervisor's SIGHUP handler runs between any two bytecodes of its loop, so it must not
take a lock the loop may hold."""

from __future__ import annotations

import multiprocessing
import signal
import socket
import threading

from gateway.server.run import run_worker
from gateway.server.workers import Supervisor, WorkerSpec, _Worker
from gateway.settings import Settings


def test_sighup_landing_while_the_loop_reads_a_workers_readiness_does_not_hang() -> None:
    context = multiprocessing.get_context("spawn")
    spec = WorkerSpec(None, None, 0, "INFO", Settings())
    with socket.socket() as sock:
        supervisor = Supervisor(spec, sock, 1, 0.0, run_worker)
        ready = context.Event()
        supervisor._workers[1] = _Worker(context.Process(target=print), ready)
        # Where the loop is inside `ready.is_set()`: the Event's (non-reentrant) lock held.
        ready._cond.acquire()  # type: ignore[attr-defined]
        try:
            handler = threading.Thread(
                target=supervisor._forward_reload, args=(signal.SIGHUP, None), daemon=True
            )
            handler.start()
            handler.join(timeout=2)
            assert not handler.is_alive(), "the SIGHUP handler blocked on the worker's Event"
        finally:
            ready._cond.release()  # type: ignore[attr-defined]
        handler.join(timeout=2)
