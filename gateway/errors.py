"""Gateway errors: each carries its HTTP status and a message safe to show the client.

One middleware turns them into `{"error": {"type", "message"}}`; handlers raise, never format.
`outcome` names the error's class in the request accounting where its status alone does not
(`gateway.obs.accounting`); `detail` is for the log line only, never the client.
"""

from __future__ import annotations

from typing import Literal

# How a request ended, in the request accounting (`gateway.obs.accounting`): a metric label.
Outcome = Literal[
    "ok",
    "client_error",
    "body_timeout",
    "shed_tenant",
    "shed_process",
    "rate_limited",
    "budget_exceeded",
    "deadline",
    "unavailable",
    "upstream_error",
    "disconnect",
    "cancelled",
    "error",
]


def clip(text: str, limit: int = 64) -> str:
    """A client's own string (a model name, a field's name) as an error message quotes it:
    at most `limit` characters. Quoted whole, a body-sized name made every refusal's response
    and log line as large as the body (1 MiB by default)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def listed(problems: list[str], limit: int = 10) -> str:
    """The first `limit` problems, and how many more: one per field could be thousands."""
    more = len(problems) - limit
    return "; ".join(problems[:limit]) + (f"; and {more} more" if more > 0 else "")


class GatewayError(Exception):
    status = 500
    type = "internal_error"
    outcome: Outcome | None = None  # None: the outcome of `status`

    def __init__(
        self, message: str, *, retry_after_s: int | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.detail = detail


class BadRequest(GatewayError):
    status = 400
    type = "bad_request"


class Unauthorized(GatewayError):
    status = 401
    type = "unauthorized"


class Forbidden(GatewayError):
    status = 403
    type = "forbidden"


class NotFound(GatewayError):
    status = 404
    type = "not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "payload_too_large"


class Unprocessable(GatewayError):
    status = 422
    type = "validation_error"


class TooManyRequests(GatewayError):
    status = 429
    type = "rate_limited"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "unavailable"


class RequestTimeout(GatewayError):
    """The request body did not arrive in time (a slow or stalled client)."""

    status = 408
    type = "request_timeout"
    outcome = "body_timeout"


# When a client whose request ran out of time may try again.
DEADLINE_RETRY_AFTER_S = 5


class DeadlineExceeded(ServiceUnavailable):
    """The request's own deadline passed before it was answered."""

    type = "deadline_exceeded"
    outcome = "deadline"


class ClientGone(ConnectionResetError):
    """The client closed the connection while we read its request."""
