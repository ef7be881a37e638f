"""One record per HTTP request: what the middleware counts and logs once when it ends.

The middleware opens a `RequestRecord` in a context variable; whatever runs for the request
(admission, the pipeline's `_observe`) adds to it, and the middleware ends every request, ok or
not, with one counter increment and one log line. Outcomes are a small closed set.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

OUTCOMES = (
    "ok",
    "client_error",  # 4xx but the ones below
    "body_timeout",  # 408: the body did not arrive in time
    "shed_tenant",  # 429: the tenant is over its share
    "shed_process",  # 503: the process is at capacity
    "deadline",  # 503: the request's deadline passed
    "unavailable",  # 503: a dependency is down
    "upstream_error",  # 503: a dependency answered with something unusable
    "disconnect",  # the client went away before the answer
    "cancelled",  # the server cancelled the request (shutdown)
    "error",  # 5xx: our bug
)


@dataclass(slots=True)
class RequestRecord:
    endpoint: str
    started: float = field(default_factory=time.perf_counter)
    tenant: str | None = None
    # Set by the pipeline when it counted an answer in querygate_requests_total.
    answered: bool = False
    # Fields for the request's one log line (route, cache, cost, tokens, ...).
    fields: dict[str, Any] = field(default_factory=dict)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


current_record: ContextVar[RequestRecord | None] = ContextVar("request_record", default=None)
