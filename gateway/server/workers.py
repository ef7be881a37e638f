"""`querygate serve --workers N`: N worker processes on one port, supervised.

Each worker is a fresh interpreter (the `spawn` start method: litellm and the model's threads
do not survive fork) running the whole app with its own event loop. The supervisor binds the
port once — a taken port fails there — and hands the socket to every worker; they listen on it
and accept from its one queue in turn. Metrics are written
per process into a shared directory (prometheus-client's multiprocess mode) and whichever
worker serves `/metrics` reports the sum.

A worker tells the supervisor when it is ready (its backends open, the app serving). One that
dies is replaced: at once if it had been serving (after a pause that doubles, up to
`server.worker_max_pause_s` (30 s by default), when serving workers keep dying less than a
minute apart: a crash loop must not spend the cores on model loads), after a pause that doubles
if it died starting. Before any worker has served, three that die starting in a row stop the
supervisor (exit 1; exit 2 at once when the configuration is refused): nothing is serving, so
failing fast is right. Once one has served, a worker that cannot start is retried, its pause
doubling up to that longest pause, and logged each time, while the others serve; only when no
worker is serving or starting and a start has failed after the longest pause does the supervisor
give up (exit 1, so an orchestrator restarts the pod). What the supervisor counts (workers
serving, and N) is shared with every worker: `/readyz` and `querygate_workers` report it.
A replacement whose config file is refused now (an edit made after the others loaded it) starts
on the configuration the supervisor validated, and its file watch picks up the next good edit.
SIGTERM or SIGINT drains every worker within the shutdown grace; SIGHUP is passed on to every
ready worker (each reloads its configuration); a worker still starting ignores it, and gets it
once it is ready (it may have read the file before the edit).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.obs.metrics import MULTIPROC_ENV

if TYPE_CHECKING:
    from gateway.obs.logs import LogFormat
    from gateway.settings import Settings

log = logging.getLogger(__name__)

# Set in every worker's environment: `POST /admin/reload` signals the supervisor through it.
SUPERVISOR_ENV = "QUERYGATE_SUPERVISOR_PID"
_MAX_EARLY_EXITS = 3  # workers in a row that die before any worker was ever ready
_FIRST_PAUSE_S = 0.5  # before replacing one that died starting; doubles each time
# Serving workers dying less than this apart are a crash loop: each replacement waits longer.
_CRASH_WINDOW_S = 60.0

# Past the drain itself: the time a worker needs to close its backends.
_STOP_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs to start."""

    config_path: Path | None
    host: str | None
    port: int
    log_level: str
    # Validated by the supervisor (demo key included): what a worker falls back on when the
    # file is refused by the time it starts.
    settings: Settings
    log_format: LogFormat = "json"  # as the supervisor resolved it: every worker logs alike


# A worker process's entry point: (spec, shared socket, its ready event, the shared counts).
WorkerTarget = Callable[[WorkerSpec, socket.socket, Event, Any], None]


def worker_count(value: str) -> int:
    """`auto` is the cores this process may run on."""
    count = len(os.sched_getaffinity(0)) if value == "auto" else int(value)
    if not 1 <= count <= 64:
        raise ValueError("want 1 to 64 workers, or auto")
    return count


def bind(host: str, port: int) -> socket.socket:
    """The one socket every worker accepts from: bound here (a taken port fails now), listened
    on by the first worker that serves (asyncio listens on a given socket), so a client that
    comes before any worker is ready is refused rather than left waiting in a queue."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a previous run's TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class _Worker:
    process: BaseProcess
    ready: Event
    served: bool = False  # seen ready by the supervisor
    after_pause_s: float = 0.0  # the pause it was started after, replacing one that died


@dataclass(slots=True)
class Supervisor:
    spec: WorkerSpec
    sock: socket.socket
    count: int
    grace_s: float
    # The worker process's entry point (gateway.server.run.run_worker): passed in, since
    # serving a worker is run.py's concern and run.py imports this module.
    target: WorkerTarget
    max_pause_s: float = 30.0  # server.worker_max_pause_s: the longest pause of either kind
    _context: multiprocessing.context.SpawnContext = field(
        default_factory=lambda: multiprocessing.get_context("spawn")
    )
    _workers: dict[int, _Worker] = field(default_factory=dict)
    _respawn_at: list[tuple[float, float]] = field(default_factory=list)  # (when, the pause)
    _early_exits: int = 0  # workers in a row that died starting; a worker ready resets it
    _any_ready: bool = False
    _stopping: bool = False
    _reload_requested: bool = False
    _owed_reload: set[int] = field(default_factory=set)  # pids to SIGHUP once they are ready
    _last_crash: float | None = None
    _crash_streak: int = 0
    # [serving, expected]: plain shared ints, no lock (an aligned int is written whole, and a
    # lock here could be left held by a worker killed mid-read).
    _counts: Any = None

    def run(self) -> int:
        """Start the workers, replace the ones that die, drain them all on a signal."""
        metrics_dir = Path(tempfile.mkdtemp(prefix="querygate-metrics-"))
        # Inherited by every spawned worker.
        os.environ.update({MULTIPROC_ENV: str(metrics_dir), SUPERVISOR_ENV: str(os.getpid())})
        handlers = {signal.SIGTERM: self._on_stop, signal.SIGINT: self._on_stop}
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._forward_reload)
        self._counts = self._context.RawArray(ctypes.c_int, [0, self.count])
        try:
            for _ in range(self.count):
                self._spawn()
            status = self._supervise()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        return status

    def _on_stop(self, signum: int, frame: object) -> None:
        log.info("draining workers", extra={"signal": signal.Signals(signum).name})
        self._stopping = True

    def _forward_reload(self, signum: int, frame: object) -> None:
        """Only noted here; the loop passes it on. Reading a worker's ready Event in a signal
        handler could deadlock the supervisor: the Event's lock is not reentrant and the loop
        may hold it at the instant the signal lands."""
        self._reload_requested = True

    def _pass_on_reloads(self) -> None:
        """SIGHUP to every worker owed one that is ready (the app's handler installed); one
        still starting may have read the file before the edit, so it is owed one too."""
        if self._reload_requested:
            self._reload_requested = False
            self._owed_reload = set(self._workers)
        for pid in list(self._owed_reload):
            worker = self._workers.get(pid)
            if worker is None:
                self._owed_reload.discard(pid)
            elif worker.ready.is_set():
                self._owed_reload.discard(pid)
                os.kill(pid, signal.SIGHUP)

    def _spawn(self, after_pause_s: float = 0.0) -> None:
        ready = self._context.Event()
        process = self._context.Process(
            target=self.target, args=(self.spec, self.sock, ready, self._counts), daemon=False
        )
        # The new interpreter keeps only an ignored disposition: SIGHUP must not end a worker
        # before its app installs the reload handler (a signal in this instant is dropped).
        forward = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGHUP, forward)
        assert process.pid is not None
        self._workers[process.pid] = _Worker(process, ready, after_pause_s=after_pause_s)
        log.info("worker started", extra={"worker_pid": process.pid})

    def _supervise(self) -> int:
        while not self._stopping:
            self._count_serving()
            self._pass_on_reloads()
            now = time.monotonic()
            for due in [r for r in self._respawn_at if r[0] <= now]:
                self._respawn_at.remove(due)
                self._spawn(after_pause_s=due[1])
            sentinels = {w.process.sentinel: pid for pid, w in self._workers.items()}
            for sentinel in wait(list(sentinels), timeout=0.2):
                status = self._reap(sentinels[sentinel])  # type: ignore[index]
                if status is not None:
                    return status
        return 0

    def _count_serving(self) -> int:
        """Workers alive and ready, shared with every worker (for /readyz and the gauge)."""
        serving = 0
        for worker in self._workers.values():
            if worker.ready.is_set():
                serving += 1
                if not worker.served:  # a start succeeded: failed ones are no longer in a row
                    worker.served, self._any_ready, self._early_exits = True, True, 0
        if not self._stopping:
            self._counts[0] = serving
        return serving

    def _reap(self, pid: int) -> int | None:
        """A worker exited: replace it, or give up when workers cannot start."""
        worker = self._workers.pop(pid)
        worker.process.join()
        _mark_dead(pid)
        if self._stopping:
            return None
        code, was_ready = worker.process.exitcode, worker.ready.is_set()
        log.error("worker exited", extra={"worker_pid": pid, "exit_code": code, "ready": was_ready})
        if was_ready:
            self._count_serving()
            self._replace_crashed()
            return None
        return self._replace_failed_start(code, worker.after_pause_s)

    def _replace_failed_start(self, code: int | None, waited: float) -> int | None:
        """A worker died before it was ready. Before any worker has served, fail fast (nothing
        is serving; a refused config would refuse every worker). After, the others serve on:
        retry with a pause doubling up to `max_pause_s`, and give up only when none serves or
        starts once a start has failed after the longest pause (`waited`, the pause it came
        after)."""
        self._early_exits += 1
        if not self._any_ready:
            if code == 2:  # the config is refused: so would every worker be
                return 2
            if self._early_exits >= _MAX_EARLY_EXITS:
                log.error("workers keep exiting before they are ready; stopping")
                return 1
            self._respawn_after(self._backoff(self._early_exits))
            return None
        serving = self._count_serving()
        if not self._workers and waited >= self.max_pause_s:
            log.error(
                "no worker is serving and none can start; stopping",
                extra={"failed_starts_in_a_row": self._early_exits, "expected": self.count},
            )
            return 1
        pause = self._backoff(self._early_exits)
        log.error(
            "a worker failed to start; retrying after a pause",
            extra={
                "pause_s": pause,
                "failed_starts_in_a_row": self._early_exits,
                "serving": serving,
                "expected": self.count,
            },
        )
        self._respawn_after(pause)
        return None

    def _backoff(self, attempt: int) -> float:
        """The pause before the `attempt`th replacement in a row: 0.5 s doubling, at most
        `max_pause_s`. The exponent is capped too: 2.0 ** 1024 overflows a float, which a loop
        retrying every 30 s reaches in under 9 hours (and ended the supervisor with an
        OverflowError)."""
        return min(_FIRST_PAUSE_S * 2.0 ** min(attempt - 1, 16), self.max_pause_s)

    def _respawn_after(self, pause: float) -> None:
        self._respawn_at.append((time.monotonic() + pause, pause))

    def _replace_crashed(self) -> None:
        """A serving worker died: replaced at once, unless serving workers keep dying (each
        replacement costs an interpreter and a model load, seconds of CPU the survivors need)."""
        now = time.monotonic()
        recent = self._last_crash is not None and now - self._last_crash < _CRASH_WINDOW_S
        self._crash_streak = self._crash_streak + 1 if recent else 0
        self._last_crash = now
        if self._crash_streak == 0:
            self._spawn()
            return
        pause = self._backoff(self._crash_streak)
        log.error(
            "serving workers keep dying; replacing this one after a pause",
            extra={"pause_s": pause, "crashes_in_a_row": self._crash_streak + 1},
        )
        self._respawn_after(pause)

    def _stop_all(self) -> None:
        # Our copy of the listening socket: once the workers close theirs (at the start of
        # their drain) it is gone and a new client is refused at once, to retry elsewhere;
        # held, it kept the socket listening and the kernel queued clients nobody would accept
        # until they timed out.
        self.sock.close()
        if self._counts is not None:
            self._counts[0] = 0  # draining: /readyz says not ready for the rest of the drain
        for worker in self._workers.values():
            if worker.process.is_alive() and worker.process.pid is not None:
                os.kill(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + _STOP_MARGIN_S
        for worker in self._workers.values():
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.error(
                    "worker did not drain in time; killed",
                    extra={"worker_pid": worker.process.pid},
                )
                worker.process.kill()
                worker.process.join()
        self._workers.clear()


def _mark_dead(pid: int) -> None:
    """Its live gauges (in-flight requests) stop counting; its counters stay in the sum."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
