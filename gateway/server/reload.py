"""Live configuration: re-read the file, validate it whole, swap one reference.

Three triggers share one ConfigReloader: a poll of the file (a change is applied once two polls
in a row read the same file), SIGHUP, and `POST /admin/reload`. Its lock serialises them, so two
reloads never interleave. Handlers read `app[RUNTIME].current` once per request, so a request
finishes on the Runtime it started with while new requests get the new one. A configuration
that fails validation, or that changes a key only a restart can apply (gateway.server.live_keys
classifies every key), is refused and the old one keeps running. An applied reload names the
keys it changed; a refused one the keys that need a restart (names, never values).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from gateway.core.runtime import build_runtime
from gateway.core.services import Services
from gateway.http.appkeys import RUNTIME, SERVICES, RuntimeHolder
from gateway.server.live_keys import changed_keys, restart_only
from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)

Prepare = Callable[[Settings], Settings]
ReloadResult = Literal["ok", "unchanged", "error"]
ErrorType = Literal["invalid_config", "restart_required", "no_config_file", "reload_failed"]


def as_is(settings: Settings) -> Settings:
    return settings


class RestartRequired(ConfigError):
    """The new configuration is valid but changes keys only a restart can apply."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


@dataclass(frozen=True, slots=True)
class ReloadError:
    type: ErrorType
    message: str
    # restart_required: the keys only a restart applies (names only: never a value).
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    result: ReloadResult
    version: str  # the version active once the attempt is over
    error: ReloadError | None = None
    changed: tuple[str, ...] = ()  # ok: the keys the new configuration changed, all applied


@dataclass(frozen=True, slots=True)
class Fingerprint:
    mtime_ns: int
    size: int
    sha256: str


def fingerprint(path: Path) -> Fingerprint | None:
    """The file's identity, or None when it cannot be read (the reload then says why)."""
    try:
        stat = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
    return Fingerprint(stat.st_mtime_ns, stat.st_size, digest)


class ConfigReloader:
    """Reloads `path` into `holder`; `prepare` re-applies what the CLI put on top of the file
    (the demo key, --host/--port), so a reload compares like with like."""

    def __init__(
        self,
        path: Path | None,
        prepare: Prepare,
        holder: RuntimeHolder,
        services: Services,
        loaded_from: Fingerprint | None,
    ) -> None:
        self._path = path
        self._prepare = prepare
        self._holder = holder
        self._services = services
        # The file as last read: the watch reloads only when it differs.
        self._seen = loaded_from
        # A change the watch saw once: applied when the next poll reads the same file.
        self._settling: Fingerprint | None = None
        self._lock = asyncio.Lock()

    async def reload(self, trigger: str) -> ReloadOutcome:
        async with self._lock:
            if self._path is None:
                error = ReloadError("no_config_file", "started without --config: nothing to reload")
                return self._finish(trigger, self._refused(error))
            seen = await asyncio.to_thread(fingerprint, self._path)
            return await self._reload(trigger, self._path, seen)

    async def reload_if_changed(self) -> ReloadOutcome | None:
        """A reload when the file differs from the one last read and has read the same on
        two polls in a row; None otherwise. A writer that truncates and rewrites in place
        (not an atomic rename) leaves a part of the file for a moment, often valid YAML: a
        tenant list cut short would be applied, its other tenants refused, until the next
        poll."""
        async with self._lock:
            if self._path is None:
                return None
            seen = await asyncio.to_thread(fingerprint, self._path)
            if seen == self._seen:
                self._settling = None
                return None
            if seen != self._settling:
                self._settling = seen
                return None
            self._settling = None
            return await self._reload("file", self._path, seen)

    async def _reload(self, trigger: str, path: Path, seen: Fingerprint | None) -> ReloadOutcome:
        # `seen` was taken before loading: if the file changes in between, the next poll sees
        # it again. A bad file is recorded too, so the watch reports it once, not every poll.
        self._seen = seen
        active = self._holder.current.settings
        try:
            loaded = await asyncio.to_thread(load_settings, path)
            # Before `prepare`, which would mint the demo key of a configuration left with none.
            _check_tenancy(active, loaded)
            new, version = await asyncio.to_thread(self._prepared, loaded)
            # By key, secrets included, not by version: the version leaves the demo key out.
            changed = changed_keys(active, new)
            if not changed:
                return self._finish(trigger, ReloadOutcome("unchanged", active.version))
            _check_live(changed)
            runtime = build_runtime(new, self._services)
        except ConfigError as exc:
            return self._finish(trigger, self._refused(_refusal(exc)))
        except Exception as exc:
            # A bug (or an unwritable data dir in `prepare`) must not escape as a bare 500
            # uncounted: it is a refused reload like any other, with its traceback logged.
            log.exception("config reload failed unexpectedly", extra={"trigger": trigger})
            error = ReloadError("reload_failed", f"{type(exc).__name__}: {exc}")
            return self._finish(trigger, self._refused(error))
        self._holder.current = runtime
        info = self._services.metrics.config_info
        # 0 first: with several workers the series lives in a shared file that remove() leaves
        info.labels(active.version).set(0)
        info.remove(active.version)
        info.labels(version).set(1)
        outcome = ReloadOutcome("ok", version, changed=tuple(changed))
        return self._finish(trigger, outcome, from_version=active.version)

    def _prepared(self, loaded: Settings) -> tuple[Settings, str]:
        """`prepare` applied, and its version: both off the loop, since the version digests
        new secrets slowly (~0.1 s, then cached for the pipeline's own read)."""
        new = self._prepare(loaded)
        return new, new.version

    def _refused(self, error: ReloadError) -> ReloadOutcome:
        return ReloadOutcome("error", self._holder.current.settings.version, error)

    def _finish(self, trigger: str, outcome: ReloadOutcome, **context: str) -> ReloadOutcome:
        self._services.metrics.config_reloads.labels(outcome.result).inc()
        fields: dict[str, object] = {
            "trigger": trigger,
            "result": outcome.result,
            "config_version": outcome.version,
        }
        fields.update(context)
        if outcome.error is None:
            if outcome.changed:
                fields["changed_keys"] = list(outcome.changed)
            log.info("config reload", extra=fields)
        else:
            # The message names every bad field; the JSON formatter keeps it on one line.
            fields.update(error_type=outcome.error.type, error=outcome.error.message)
            if outcome.error.keys:
                fields["restart_required_keys"] = list(outcome.error.keys)
            log.error("config reload refused; the active configuration keeps running", extra=fields)
        return outcome


def _check_live(changed: list[str]) -> None:
    """Refuses a change of any key a reload cannot apply (gateway.server.live_keys)."""
    if refused := restart_only(changed):
        raise RestartRequired(f"restart required to change {', '.join(refused)}", tuple(refused))


def _check_tenancy(active: Settings, new: Settings) -> None:
    """A file left with no tenant would switch a multi-tenant gateway to the single demo
    tenant (a key minted in the data dir, every configured tenant refused): an emptied list
    is far likelier a template gone wrong than that intent, and the demo tenant is a choice
    made at start."""
    if active.tenants and not new.tenants:
        raise RestartRequired(
            "restart required to remove every tenant: with none configured the gateway "
            "serves the single demo tenant instead (tenants is empty)",
            ("tenants",),
        )


def _refusal(exc: ConfigError) -> ReloadError:
    if isinstance(exc, RestartRequired):
        return ReloadError("restart_required", str(exc), exc.keys)
    return ReloadError("invalid_config", str(exc))


RELOADER = web.AppKey("reloader", ConfigReloader)

CleanupCtx = Callable[[web.Application], AsyncIterator[None]]


def live_config(path: Path | None, prepare: Prepare = as_is) -> CleanupCtx:
    """The app's reloader and its two background triggers (file watch, SIGHUP).

    Goes into cleanup_ctx after the backends, so the Runtime it swaps exists, and the
    triggers stop before the backends close.
    """
    # Taken now, right after the CLI read the file: an edit made while the backends start
    # (seconds, for the embedding model) is then still seen as a change.
    loaded_from = fingerprint(path) if path is not None else None

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        holder = app[RUNTIME]
        reloader = ConfigReloader(path, prepare, holder, app[SERVICES], loaded_from)
        app[RELOADER] = reloader
        interval = holder.current.settings.server.reload_poll_s
        async with AsyncExitStack() as stack:
            if path is not None and interval > 0:
                await stack.enter_async_context(_running(_watch_file(reloader, interval)))
            # Signal handlers belong to the main thread's loop; elsewhere (an app built
            # inside a test's thread) there is no SIGHUP trigger.
            if threading.current_thread() is threading.main_thread():
                await stack.enter_async_context(_on_sighup(reloader))
            yield

    return ctx


async def _watch_file(reloader: ConfigReloader, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        await _survive(reloader.reload_if_changed())


@asynccontextmanager
async def _on_sighup(reloader: ConfigReloader) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    hup = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, hup.set)
    try:
        async with _running(_serve_sighup(reloader, hup)):
            yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


async def _serve_sighup(reloader: ConfigReloader, hup: asyncio.Event) -> None:
    while True:
        await hup.wait()
        # Cleared before reloading: signals that arrive meanwhile make exactly one more.
        hup.clear()
        await _survive(reloader.reload("sighup"))


async def _survive(attempt: Awaitable[object]) -> None:
    """A bug in one reload is logged; it must not end the trigger that runs the next one."""
    try:
        await attempt
    except Exception:
        log.exception("config reload failed unexpectedly")


@asynccontextmanager
async def _running(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
