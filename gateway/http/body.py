"""Request bodies: strict JSON, validated into the endpoint's schema, or a 4xx saying why."""

from __future__ import annotations

import json
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from gateway.errors import BadRequest, Unprocessable, clip, listed
from gateway.http.appkeys import RUNTIME
from gateway.http.middleware.limits import read_body

Model = TypeVar("Model", bound=BaseModel)


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
