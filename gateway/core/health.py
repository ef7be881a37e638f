"""Dependency health as a metric: each process probes its backends on a timer, so an alert can
say "the cache is down" without waiting for traffic to fail (and without a scrape of /readyz).

A dependency is up, down, or up but degraded: it serves in full, short of its redundancy (an
OpenSearch cluster with a node down: every shard still has a copy serving, some replica is
unassigned). Degraded counts as up for `querygate_dependency_up` and for readiness: the fault is
one the dependency absorbs, and a 503 would pull every replica of the gateway out of the load
balancer for it. /readyz names it (`degraded`) and the watch logs it."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backends.errors import BackendError
from gateway.core.services import Services
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
# /readyz reuses a verdict whose probe started less than this ago: a burst of calls (it is
# unauthenticated) costs each backend at most one ping per interval, and a backend that went
# down is reported within about this (plus the probe's own time, at most PROBE_TIMEOUT_S).
READYZ_MAX_AGE_S = 1.0


Ping = Callable[[], Awaitable[str | None]]


def probes(services: Services) -> dict[str, Ping]:
    """The dependencies this process uses, by the `dependency` label they are reported under."""
    found: dict[str, Ping] = {"retrieval": services.retriever.ping}
    if services.cache_store is not None:
        found["cache"] = services.cache_store.ping
    if services.quotas is not None and services.quotas.is_shared:
        found["quotas"] = services.quotas.ping  # also clears querygate_quota_store_degraded
    return found


@dataclass(frozen=True, slots=True)
class Down:
    """Why a probe failed: `kind` (timeout or the exception's class) tells one failure from
    another, `reason` is for the log line; `bug` when the ping raised something no backend seam
    should (its traceback is logged)."""

    kind: str
    reason: str
    bug: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Degraded:
    """The dependency answered, serving in full short of its redundancy; `note` says how."""

    note: str


def _down(exc: BaseException, bug: bool = False) -> Down:
    return Down(type(exc).__name__, f"{type(exc).__name__}: {exc}", exc if bug else None)


async def probe(ping: Ping) -> Down | Degraded | None:
    """None when the dependency answered within PROBE_TIMEOUT_S and is whole, `Degraded` when
    it answered with a note, else why not. Never raises (except to cancel the caller): whatever
    a ping raises means that dependency is down."""
    try:
        note = await asyncio.wait_for(ping(), timeout=PROBE_TIMEOUT_S)
    except TimeoutError:
        return Down("timeout", f"no answer within {PROBE_TIMEOUT_S:g} s")
    except BackendError as exc:
        return _down(exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the watch itself is being cancelled
        return _down(exc, bug=True)  # a library cancelled its own call
    except Exception as exc:
        return _down(exc, bug=True)
    return None if note is None else Degraded(note)


async def watch_dependencies(services: Services, metrics: Metrics, every_s: float) -> None:
    """Set `querygate_dependency_up{dependency}` to 1 or 0 every `every_s`, until cancelled.

    A probe failing in any way (an error, a hang, an exception no backend seam should raise)
    reports that dependency down and the watch goes on: the gauge never freezes at a stale
    value. Logged: a dependency found down (on the first probe too) or failing in a new way
    (with the traceback when the ping raised something unexpected), its return, and a change
    of its degraded note."""
    checks = probes(services)
    last: dict[str, Down | Degraded | None] = {}
    while True:
        for name, ping in checks.items():
            verdict = await probe(ping)
            down = verdict if isinstance(verdict, Down) else None
            metrics.dependency_up.labels(name).set(0 if down else 1)
            before = last.get(name)  # None: up, or not probed yet
            last[name] = verdict
            if isinstance(verdict, Degraded):
                if before != verdict:
                    log.warning(
                        "dependency degraded", extra={"dependency": name, "error": verdict.note}
                    )
            elif down is None:
                if before is not None:
                    log.info("dependency up again", extra={"dependency": name})
            elif not isinstance(before, Down) or before.kind != down.kind:
                log.warning(
                    "dependency down",
                    extra={"dependency": name, "error": down.reason},
                    exc_info=down.bug,
                )
        await asyncio.sleep(every_s)


class Readiness:
    """/readyz's checks, probed at most once per `max_age_s` however often it is called.

    Callers within `max_age_s` of the last probe's start get its verdict; callers while a probe
    is in flight wait for that one (never a second): so the backends see one ping each per
    interval, and the verdict is never older than the interval plus one probe. The probe runs
    in its own task, so a caller that hangs up does not cancel it for the others."""

    def __init__(self, services: Services, max_age_s: float = READYZ_MAX_AGE_S) -> None:
        self._pings: dict[str, Ping] = {"retrieval": services.retriever.ping}
        if services.cache_store is not None:
            self._pings["cache"] = services.cache_store.ping
        self._max_age_s = max_age_s
        self._checks: dict[str, str] = {}
        self._started = -math.inf  # when the probe that found `_checks` started
        self._inflight: asyncio.Task[dict[str, str]] | None = None

    async def checks(self) -> dict[str, str]:
        """`ok`, `degraded` or `unavailable` per dependency (retrieval, and the cache when
        there is one)."""
        if time.monotonic() - self._started < self._max_age_s:
            return self._checks
        if self._inflight is None:
            self._inflight = asyncio.create_task(self._probe())
        return await asyncio.shield(self._inflight)

    async def _probe(self) -> dict[str, str]:
        started = time.monotonic()
        try:
            # Concurrently: a slow cache does not delay the retrieval verdict.
            downs = await asyncio.gather(*(probe(ping) for ping in self._pings.values()))
            checks: dict[str, str] = {}
            for name, down in zip(self._pings, downs, strict=True):
                checks[name] = _state(down)
                if isinstance(down, Down):
                    # /readyz is unauthenticated: the detail (a library's text) goes to the
                    # log only
                    log.warning(
                        "readiness check failed",
                        extra={"dependency": name, "error": down.reason},
                        exc_info=down.bug,
                    )
            self._checks, self._started = checks, started
            return checks
        finally:
            self._inflight = None


def _state(verdict: Down | Degraded | None) -> str:
    if verdict is None:
        return "ok"
    return "degraded" if isinstance(verdict, Degraded) else "unavailable"
