"""Failures as HTTP sees them: the endpoint a request counts under, aiohttp's own exceptions
beside `gateway.errors`' table, and the JSON error response every failure becomes."""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.web_urldispatcher import SystemRoute

from gateway import errors
from gateway.errors import Failure, status_outcome


def endpoint_of(request: web.Request) -> str:
    """The method and route template: a closed set (unknown paths are 'unmatched')."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or isinstance(route, SystemRoute):
        return "unmatched"
    path = re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", resource.canonical)
    return f"{route.method} {path}"


def error_response(
    status: int, kind: str, message: str, retry_after_s: int | None = None
) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body = {"error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def request_failure(exc: Exception, *, client_gone: bool, client_shaped: bool = False) -> Failure:
    """The failure an exception means for an HTTP request: `gateway.errors.failure_of`'s, or
    aiohttp's own HTTP exceptions' (404, 405, 413). `client_gone`: the client's connection is
    closed; `client_shaped`: the request's `RequestRecord.client_shaped`."""
    if isinstance(exc, web.HTTPException):  # aiohttp's own: 404, 405, 413
        kind = _HTTP_KINDS.get(exc.status, "bad_request")
        return Failure(status_outcome(exc.status), exc.status, kind, exc.reason, exc.reason)
    return errors.failure_of(exc, client_gone=client_gone, client_shaped=client_shaped)


def failure_response(failure: Failure) -> web.Response:
    if failure.outcome == "disconnect":
        return web.Response(status=499)  # nobody reads it
    return error_response(failure.status, failure.kind, failure.message, failure.retry_after_s)


_HTTP_KINDS = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
