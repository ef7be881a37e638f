"""Running the server: one process on its own port, or a supervisor and its workers on one
socket. `querygate serve` (gateway/cli) parses the command line and calls them."""

from __future__ import annotations

import logging
import secrets
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from gateway.http.appkeys import RUNTIME
from gateway.http.protocol import ConnectionTimeouts, run_app
from gateway.ingest.background import BackgroundIngest
from gateway.obs import pool, tracing
from gateway.obs.logs import LogFormat, configure_logging
from gateway.server.app import create_app
from gateway.server.workers import Supervisor, WorkerSpec, bind
from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger("querygate")

DEMO_KEY_FILE = "demo_api_key"


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What the command line puts on top of the configuration file; a reload applies it again."""

    config_path: Path | None
    host: str | None
    port: int | None
    log_level: str
    workers: int
    log_format: LogFormat = "json"


def with_demo_key(settings: Settings, announce: bool = True) -> Settings:
    """With no tenants configured, the demo tenant's key comes from the environment or is
    generated once and kept in the data directory."""
    if settings.tenants or settings.demo_api_key is not None:
        return settings
    path = settings.data_dir / DEMO_KEY_FILE
    if path.exists():
        key = path.read_text(encoding="utf-8").strip()
        if announce:
            print(f"demo tenant API key: stored in {path}", file=sys.stderr)
    else:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        key = "qg-demo-" + secrets.token_urlsafe(24)
        path.touch(mode=0o600)
        path.write_text(key + "\n", encoding="utf-8")
        print(f"demo tenant API key (shown once, kept in {path}): {key}", file=sys.stderr)
    return settings.model_copy(update={"demo_api_key": SecretStr(key)})


def serve_settings(settings: Settings, options: ServeOptions, announce: bool = True) -> Settings:
    """The demo key and --host/--port on top of the file; a reload applies them again."""
    settings = with_demo_key(settings, announce)
    given = (("host", options.host), ("port", options.port))
    server = settings.server.model_copy(update={k: v for k, v in given if v is not None})
    return settings.model_copy(update={"server": server})


def serve_one(
    settings: Settings, options: ServeOptions, startup_ingest: BackgroundIngest | None = None
) -> int:
    """One process on its own port; `startup_ingest` runs inside the app while it answers."""
    return _run_app(settings, options, startup_ingest=startup_ingest)


def supervise(settings: Settings, options: ServeOptions) -> int:
    """A supervisor of `options.workers` worker processes on one socket."""
    server = settings.server
    try:
        sock = bind(server.host, server.port)
    except OSError as exc:
        print(f"cannot listen on {server.host}:{server.port}: {exc}", file=sys.stderr)
        return 2
    with sock:
        port = int(sock.getsockname()[1])  # the one chosen when the config says 0
        spec = WorkerSpec(
            options.config_path, options.host, port, options.log_level, settings, options.log_format
        )
        return Supervisor(
            spec,
            sock,
            options.workers,
            server.shutdown_grace_s,
            run_worker,
            max_pause_s=server.worker_max_pause_s,
        ).run()


def run_worker(spec: WorkerSpec, sock: socket.socket, ready: Event, counts: Any) -> None:
    """A worker process's whole life; the process exit code says how it ended."""
    pool.share(counts)
    raise SystemExit(serve_worker(spec, sock, ready.set))


def serve_worker(spec: WorkerSpec, sock: socket.socket, on_ready: Callable[[], None]) -> int:
    """One worker of `serve --workers N` (in a fresh interpreter): the app on the shared socket."""
    configure_logging(spec.log_level, spec.log_format)
    options = ServeOptions(
        spec.config_path, spec.host, spec.port, spec.log_level, 1, spec.log_format
    )
    try:
        settings = serve_settings(load_settings(spec.config_path), options, announce=False)
    except ConfigError as exc:
        # Edited since the supervisor read it: start on what it validated; the file watch
        # reloads the next good edit.
        log.error(
            "config file refused; starting on the configuration the supervisor validated",
            extra={"error": str(exc)},
        )
        settings = spec.settings
    return _run_app(settings, options, sock=sock, on_ready=on_ready)


def _run_app(
    settings: Settings,
    options: ServeOptions,
    *,
    sock: socket.socket | None = None,
    on_ready: Callable[[], None] | None = None,
    startup_ingest: BackgroundIngest | None = None,
) -> int:
    # Here, in the process that serves (a worker, not the supervisor): the exporter's thread
    # is this process's own.
    traces = tracing.install(settings.tracing)
    try:
        return _serve(settings, options, traces is not None, sock, on_ready, startup_ingest)
    finally:
        if traces is not None:
            traces.shutdown()  # the spans of the last requests, exported before exit


def _serve(
    settings: Settings,
    options: ServeOptions,
    traced: bool,
    sock: socket.socket | None,
    on_ready: Callable[[], None] | None,
    startup_ingest: BackgroundIngest | None,
) -> int:
    server = settings.server
    app = create_app(
        settings,
        options.config_path,
        lambda fresh: serve_settings(fresh, options, False),
        startup_ingest=startup_ingest,
        freeze_heap=True,
        traced=traced,
    )
    if on_ready is not None:

        async def ready(app: web.Application) -> None:  # runs after every backend has opened
            on_ready()

        app.on_startup.append(ready)
    where: dict[str, Any] = {"sock": sock} if sock else {"host": server.host, "port": server.port}
    try:
        run_app(  # aiohttp's, with a deadline on request headers and JSON protocol errors
            app,
            **where,
            # the active configuration's: a reload applies to the connections after it
            timeouts=ConnectionTimeouts(
                header_read_s=lambda: app[RUNTIME].current.settings.server.header_read_timeout_s,
                keepalive_s=lambda: app[RUNTIME].current.settings.server.keepalive_timeout_s,
            ),
            shutdown_timeout=server.shutdown_grace_s,
            # A client that hangs up stops its request's work (an agent loop, model calls): nobody
            # would read the answer, and the tenant would still pay for it.
            handler_cancellation=True,
            access_log=None,
            print=lambda msg: log.info(msg),
        )
    except ConfigError as exc:
        # found while starting the backends (e.g. an index layout that needs migrating)
        print(exc, file=sys.stderr)
        return 2
    return 0
