"""`querygate serve --workers N`: N worker processes on one port, supervised.

Each worker is a fresh interpreter (the `spawn` start method: litellm and the model's threads
do not survive fork) running the whole app with its own event loop. They share the port with
SO_REUSEPORT, so the kernel spreads connections over them evenly; the supervisor holds a bound
socket in the same group first, which fails fast if the port is taken and keeps it reserved
while a worker restarts. Metrics are written per process into a shared directory
(prometheus-client's multiprocess mode) and whichever worker serves `/metrics` reports the sum.

A worker that dies is replaced; one that keeps dying at start (a bad config, the port) stops
the supervisor. SIGTERM or SIGINT drains every worker within the shutdown grace; SIGHUP is
passed on to every worker (each reloads its configuration).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from gateway.metrics import MULTIPROC_ENV

log = logging.getLogger(__name__)

# A worker that exits sooner than this after starting counts towards a crash loop.
_EARLY_EXIT_S = 10.0
_MAX_EARLY_EXITS = 3
# Past the drain itself: the time a worker needs to close its backends.
_STOP_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs to start: everything else it reads from the config itself."""

    config_path: Path | None
    host: str | None
    port: int | None
    log_level: str


def worker_count(value: str) -> int:
    """`auto` is the cores this process may run on."""
    if value == "auto":
        return len(os.sched_getaffinity(0))
    count = int(value)
    if not 1 <= count <= 64:
        raise ValueError("want 1 to 64 workers, or auto")
    return count


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) in the port's SO_REUSEPORT group: a taken port fails here, once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Supervisor:
    def __init__(self, spec: WorkerSpec, count: int, grace_s: float) -> None:
        self._spec = spec
        self._count = count
        self._grace_s = grace_s
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[int, tuple[BaseProcess, float]] = {}
        self._early_exits = 0
        self._stopping = False

    def run(self) -> int:
        """Start the workers, replace the ones that die, drain them all on a signal."""
        metrics_dir = Path(tempfile.mkdtemp(prefix="querygate-metrics-"))
        os.environ[MULTIPROC_ENV] = str(metrics_dir)  # inherited by every spawned worker
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._forward_reload)
        try:
            for _ in range(self._count):
                self._spawn()
            status = self._supervise()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        return status

    def _on_signal(self, signum: int, frame: object) -> None:
        log.info("draining workers", extra={"signal": signal.Signals(signum).name})
        self._stopping = True

    def _forward_reload(self, signum: int, frame: object) -> None:
        """SIGHUP reloads the configuration: every worker reloads its own."""
        for process, _ in self._workers.values():
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGHUP)

    def _spawn(self) -> None:
        process = self._context.Process(target=run_worker, args=(self._spec,), daemon=False)
        process.start()
        assert process.pid is not None
        self._workers[process.pid] = (process, time.monotonic())
        log.info("worker started", extra={"worker_pid": process.pid, "workers": len(self._workers)})

    def _supervise(self) -> int:
        while not self._stopping:
            sentinels = [p.sentinel for p, _ in self._workers.values()]
            for ready in wait(sentinels, timeout=0.5):
                status = self._reap(ready)
                if status is not None:
                    return status
        return 0

    def _reap(self, sentinel: object) -> int | None:
        """A worker exited: replace it, or give up when workers keep dying at start."""
        pid, (process, started) = next(
            (pid, entry) for pid, entry in self._workers.items() if entry[0].sentinel == sentinel
        )
        process.join()
        del self._workers[pid]
        _mark_dead(pid)
        code = process.exitcode
        if self._stopping:
            return None
        log.error("worker exited", extra={"worker_pid": pid, "exit_code": code})
        if code == 2:  # the config was refused: every replacement would be too
            return 2
        early = time.monotonic() - started < _EARLY_EXIT_S
        self._early_exits = self._early_exits + 1 if early else 0
        if self._early_exits >= _MAX_EARLY_EXITS:
            log.error("workers keep exiting at start; stopping")
            return 1
        self._spawn()
        return None

    def _stop_all(self) -> None:
        for process, _ in self._workers.values():
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self._grace_s + _STOP_MARGIN_S
        for process, _ in self._workers.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("worker did not drain in time; killed", extra={"worker_pid": process.pid})
                process.kill()
                process.join()
        self._workers.clear()


def _mark_dead(pid: int) -> None:
    """Its live gauges (in-flight requests) stop counting; its counters stay in the sum."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def run_worker(spec: WorkerSpec) -> None:
    """A worker's whole life; the process exit code says how it ended."""
    from gateway.cli import serve_worker

    raise SystemExit(serve_worker(spec))
