"""Request bodies: read under a timeout, strict JSON, validated into the endpoint's schema, or
a 4xx saying why. `read_body` is the one place a body read becomes an HTTP error; the limits
middleware reads the body with it before admission, and the handlers get it back at once."""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import BaseModel, ValidationError

from gateway.errors import (
    BadRequest,
    ClientGone,
    PayloadTooLarge,
    RequestTimeout,
    Unprocessable,
    clip,
    listed,
)
from gateway.http.appkeys import RUNTIME

Model = TypeVar("Model", bound=BaseModel)
UNDECODABLE_BODY = "the request body cannot be decoded (its Content-Encoding or chunked framing)"


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def load_json(raw: bytes) -> object:
    """The body as JSON, or 400 saying why not: strict UTF-8 and standard JSON only (no NaN or
    Infinity), integers of at most 4,300 digits, nesting under Python's recursion limit."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest("the body is not valid JSON: nested too deeply") from exc
    except ValueError as exc:  # NaN, Infinity, an integer over 4,300 digits
        reason = "an integer with over 4,300 digits" if "digits" in str(exc) else str(exc)
        raise BadRequest(f"the body is not valid JSON: {reason}") from exc


async def parse_body(request: web.Request, model: type[Model]) -> Model:
    # Already read by the limits middleware (then this returns it at once).
    server = request.app[RUNTIME].current.settings.server
    data = load_json(await read_body(request, server.body_read_timeout_s))
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise Unprocessable(describe_validation(exc)) from exc


def describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        field = ".".join(clip(str(p)) for p in err["loc"]) or "body"
        parts.append(f"{field}: {err['msg']}")
    return listed(parts)


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body (cached: `request.read()` returns it again), or the error to answer.

    The one place a body read becomes an HTTP error; a library's detail goes to the log only.
    """
    declared = request.content_length
    if declared is not None and declared > request.client_max_size and not _encoded(request):
        # Refused before a byte of it is read: waiting for a body that will be refused anyway
        # held the connection (and a slot) for body_read_timeout_s when the client stalled.
        raise PayloadTooLarge(f"request body over {request.client_max_size} bytes")
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body over {request.client_max_size} bytes") from exc
    except ConnectionError as exc:
        raise ClientGone("the client closed the connection during the body") from exc
    except HttpProcessingError as exc:  # a corrupt gzip/deflate body, a broken chunked body
        raise BadRequest(UNDECODABLE_BODY, detail=exc.message) from exc
    except RequestPayloadError as exc:  # how aiohttp's reader reports the same (zlib's error)
        raise BadRequest(UNDECODABLE_BODY, detail=str(exc)) from exc


def _encoded(request: web.Request) -> bool:
    """A compressed body's declared length is not the length the limit applies to."""
    return request.headers.get("Content-Encoding", "identity").lower() != "identity"
