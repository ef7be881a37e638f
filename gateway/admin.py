"""Operator endpoints, behind the admin key."""

from __future__ import annotations

from aiohttp import web

from gateway.appkeys import RUNTIME
from gateway.reload import RELOADER


async def handle_reload(request: web.Request) -> web.Response:
    """Reload the config file: 200 with the active version, or 422 saying why it was refused
    (and which version still serves)."""
    request.app[RUNTIME].current.check_admin(request.headers.get("Authorization"))
    outcome = await request.app[RELOADER].reload("admin")
    if outcome.error is None:
        return web.json_response({"result": outcome.result, "version": outcome.version})
    error = {"type": outcome.error.type, "message": outcome.error.message}
    return web.json_response({"error": error, "version": outcome.version}, status=422)
