"""The request deadline, and the routing refusals that become HTTP errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import DEADLINE_RETRY_AFTER_S, BadRequest, DeadlineExceeded, Forbidden
from routers.policy import RouteNotAllowed
from routers.types import OptionNotHonoured


@asynccontextmanager
async def request_guard(deadline: float) -> AsyncIterator[None]:
    """Until `deadline` (a loop time: the request's own, `RequestScope.deadline`), with the
    routing refusals as the HTTP errors they are."""
    try:
        async with asyncio.timeout_at(deadline):
            yield
    except RouteNotAllowed as exc:
        raise Forbidden(str(exc)) from exc
    except OptionNotHonoured as exc:
        raise BadRequest(str(exc)) from exc
    except TimeoutError as exc:
        raise DeadlineExceeded(
            "the request deadline passed", retry_after_s=DEADLINE_RETRY_AFTER_S
        ) from exc
