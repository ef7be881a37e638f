"""Operator endpoints, behind the admin key.

They live in server/, not http/handlers/: a reload drives the server's reloader and tells the
supervisor's sibling workers, both of which belong to the server layer above http/.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web
from pydantic import BaseModel, SecretStr

from gateway.http.appkeys import RUNTIME
from gateway.server.reload import RELOADER
from gateway.server.workers import SUPERVISOR_ENV
from gateway.settings import Settings

log = logging.getLogger(__name__)

REDACTED = "**********"


async def handle_reload(request: web.Request) -> web.Response:
    """Reload the config file: 200 with the active version, or 422 saying why it was refused
    (500 if the reload itself failed; either way, which version still serves)."""
    request.app[RUNTIME].current.check_admin(request.headers.get("Authorization"))
    outcome = await request.app[RELOADER].reload("admin")
    if outcome.error is None:
        body = {"result": outcome.result, "version": outcome.version}
        if (told := _reload_siblings()) is not None:
            body["other_workers"] = "told" if told else "unreachable"
        return web.json_response(body)
    error = {"type": outcome.error.type, "message": outcome.error.message}
    # reload_failed is the gateway's fault (logged with its traceback), not the file's
    status = 500 if outcome.error.type == "reload_failed" else 422
    return web.json_response({"error": error, "version": outcome.version}, status=status)


def _reload_siblings() -> bool | None:
    """Under `serve --workers N` the other workers reload too: the supervisor passes SIGHUP
    on to each (this one finds its file unchanged). False when it is gone: this worker's
    reload stands, the others were not told (None: a single process, no others)."""
    if not (supervisor := os.environ.get(SUPERVISOR_ENV)):
        return None
    pid = int(supervisor)
    # The supervisor is this worker's parent; once it has died its pid may be another
    # process's, which must not get a SIGHUP.
    if os.getppid() == pid:
        try:
            os.kill(pid, signal.SIGHUP)
            return True
        except ProcessLookupError:  # died since
            pass
    log.warning(
        "the supervisor is gone: the other workers were not told to reload",
        extra={"supervisor_pid": pid},
    )
    return False


async def handle_config(request: web.Request) -> web.Response:
    """The configuration serving now (file, environment and command line applied), secrets
    redacted: every secret value (the demo key) and the user and password of every URL (the
    Redis URL, OpenSearch hosts, model API bases). API key digests are shown: they are how
    keys are configured, not keys."""
    runtime = request.app[RUNTIME].current
    runtime.check_admin(request.headers.get("Authorization"))
    settings = runtime.settings
    return web.json_response(
        {"config_version": settings.version, "config": redacted_config(settings)}
    )


def redacted_config(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json")
    _reveal_urls(settings, data)
    scrubbed: dict[str, Any] = _scrub(data)
    return scrubbed


def _reveal_urls(model: BaseModel, data: dict[str, Any]) -> None:
    """A secret that is a URL is shown without its user and password (the dump shows every
    secret as REDACTED), so an operator can still tell which server it names."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr) and "://" in (secret := value.get_secret_value()):
            data[name] = redact_url(secret)
        elif isinstance(value, BaseModel):
            _reveal_urls(value, data[name])
        elif isinstance(value, tuple | list):
            for item, dumped in zip(value, data[name], strict=True):
                if isinstance(item, BaseModel):
                    _reveal_urls(item, dumped)


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return redact_url(value)
    return value


def redact_url(url: str) -> str:
    """`url` with its userinfo (user and password) replaced by REDACTED."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED  # not a URL after all: it may be anything
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))
