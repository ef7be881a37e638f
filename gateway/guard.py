"""The request deadline, and the routing refusals that become HTTP errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import Forbidden, ServiceUnavailable
from routers.policy import RouteNotAllowed


@asynccontextmanager
async def request_guard(deadline_s: float) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(deadline_s):
            yield
    except RouteNotAllowed as exc:
        raise Forbidden(str(exc)) from exc
    except TimeoutError as exc:
        raise ServiceUnavailable("the request deadline passed", retry_after_s=5) from exc
