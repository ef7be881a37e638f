"""The request deadline, and the routing refusals that become HTTP errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar

from gateway.errors import BadRequest, DeadlineExceeded, Forbidden
from routers.policy import RouteNotAllowed
from routers.types import OptionNotHonoured

# The loop time by which the current request must be answered, set by the middleware when the
# request arrives: time spent reading the body and waiting for admission counts against it.
request_deadline: ContextVar[float | None] = ContextVar("request_deadline", default=None)

DEADLINE_RETRY_AFTER_S = 5


@asynccontextmanager
async def request_guard(deadline_s: float) -> AsyncIterator[None]:
    """At most `deadline_s` from now, and never past the request's own deadline."""
    when = asyncio.get_running_loop().time() + deadline_s
    arrived_by = request_deadline.get()
    if arrived_by is not None:
        when = min(when, arrived_by)
    try:
        async with asyncio.timeout_at(when):
            yield
    except RouteNotAllowed as exc:
        raise Forbidden(str(exc)) from exc
    except OptionNotHonoured as exc:
        raise BadRequest(str(exc)) from exc
    except TimeoutError as exc:
        raise DeadlineExceeded(
            "the request deadline passed", retry_after_s=DEADLINE_RETRY_AFTER_S
        ) from exc
