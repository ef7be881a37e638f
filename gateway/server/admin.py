"""Operator endpoints, behind the admin key.

They live in server/, not http/handlers/: a reload drives the server's reloader and tells the
supervisor's sibling workers, both of which belong to the server layer above http/.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from aiohttp import web

from backends.credentials import mask
from gateway.http.appkeys import RUNTIME
from gateway.server.reload import RELOADER
from gateway.server.workers import SUPERVISOR_ENV
from gateway.settings import Settings

log = logging.getLogger(__name__)


async def handle_reload(request: web.Request) -> web.Response:
    """Reload the config file: 200 with the active version, or 422 saying why it was refused
    (500 if the reload itself failed; either way, which version still serves)."""
    request.app[RUNTIME].current.check_admin(request.headers.get("Authorization"))
    outcome = await request.app[RELOADER].reload("admin")
    if outcome.error is None:
        body: dict[str, Any] = {"result": outcome.result, "version": outcome.version}
        if outcome.changed:
            body["changed"] = list(outcome.changed)  # key names only, never a value
        if (told := _reload_siblings()) is not None:
            body["other_workers"] = "told" if told else "unreachable"
        return web.json_response(body)
    error: dict[str, Any] = {"type": outcome.error.type, "message": outcome.error.message}
    if outcome.error.keys:
        error["restart_required"] = list(outcome.error.keys)
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
    """The configuration serving now (file, environment and command line applied), every
    credential redacted in each form the clients accept (backends.credentials: secret values,
    a URL's user and password, a query's password or key). API key digests and the names of
    key variables are shown: they are how keys are configured, not keys."""
    runtime = request.app[RUNTIME].current
    runtime.check_admin(request.headers.get("Authorization"))
    settings = runtime.settings
    return web.json_response(
        {"config_version": settings.version, "config": redacted_config(settings)}
    )


def redacted_config(settings: Settings) -> dict[str, Any]:
    return mask(settings).data
