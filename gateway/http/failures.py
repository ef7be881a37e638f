"""Failures as HTTP sees them: the endpoint a request counts under, aiohttp's own exceptions
beside `gateway.errors`' table, and the JSON error response every failure becomes.

aiohttp's router refuses a path it does not serve (404) and a method a path does not take
(405); both are told in the same JSON shape, the 404 naming the endpoints this gateway serves
(an OpenAI client pointed at an endpoint it lacks, `/v1/responses` say, learns which it has),
the 405 with the `Allow` header RFC 9110 requires and the methods in its message."""

from __future__ import annotations

import re
from dataclasses import replace

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource, SystemRoute

from gateway import errors
from gateway.errors import Failure, clip, status_outcome


def endpoint_of(request: web.Request) -> str:
    """The method and route template: a closed set (unknown paths are 'unmatched')."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or isinstance(route, SystemRoute):
        return "unmatched"
    return f"{route.method} {_template(resource)}"


def endpoints(app: web.Application) -> list[str]:
    """Every endpoint a request to `app` can count under, as `endpoint_of` names it (HEAD,
    which aiohttp adds beside each GET, left out: it counts once it is asked for)."""
    named = [
        f"{route.method} {_template(route.resource)}"
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    ]
    return [*dict.fromkeys(named), "unmatched"]


def _template(resource: AbstractResource) -> str:
    return _PARAMETER.sub(r"{\1}", resource.canonical)


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


def routing_failure(request: web.Request, exc: web.HTTPException) -> Failure:
    """aiohttp's refusal of a path (404) or a method (405), told what it refuses; any other
    of its exceptions as `request_failure` tells it."""
    failure = request_failure(exc, client_gone=False)
    path = clip(request.path)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"{clip(request.method)} is not allowed on {path}; allowed: {allowed}"
    elif isinstance(exc, web.HTTPNotFound) and endpoint_of(request) == "unmatched":
        hint = _HINTS.get(request.path.rstrip("/"), "")
        message = f"no endpoint at {path}{hint}; this gateway serves {served(request.app)}"
    else:
        return failure
    return replace(failure, message=message)


def served(app: web.Application) -> str:
    """The app's endpoints, "METHOD /path" each (HEAD, which aiohttp adds to GET, left out)."""
    return ", ".join(
        f"{route.method} {_template(route.resource)}"
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    )


def failure_response(failure: Failure, exc: BaseException | None = None) -> web.Response:
    """The failure's JSON error; a 405 (`exc` aiohttp's) carries `Allow` (RFC 9110, 15.5.6)."""
    if failure.outcome == "disconnect":
        return web.Response(status=499)  # nobody reads it
    response = error_response(failure.status, failure.kind, failure.message, failure.retry_after_s)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
    return response


# A route template's parameter, with its regex if any: `{doc_id:.+}` reads `{doc_id}`.
_PARAMETER = re.compile(r"\{(\w+)(:[^}]*)?\}")
# OpenAI's endpoints that are not served here, and what to send instead.
_HINTS = {
    "/v1/responses": " (OpenAI's Responses API is not served: send POST /v1/chat/completions)",
    "/v1/chat": " (did you mean POST /v1/chat/completions?)",
}
_HTTP_KINDS = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
