"""Gateway errors, and the one table of what a client is told of each failure.

Handlers and stages raise, never format: the outcome middleware
(`gateway.http.middleware.outcome`) turns every exception into `{"error": {"type", "message"}}`
through `failure_of` (aiohttp's own exceptions beside it: `gateway.http.failures`), and a stream
that fails after its headers went out (`gateway.http.streaming`) ends with an error event from
the same `Failure`. `detail`, and a library's own text, go to the log line only.

Our tree, with each class's status and `type`, and its `outcome` (the request accounting's
name for it) where the status alone does not say it:

    GatewayError                 500 internal_error
    ├── BadRequest               400 bad_request
    ├── Unauthorized             401 unauthorized
    ├── Forbidden                403 forbidden
    ├── NotFound                 404 not_found
    ├── RequestTimeout           408 request_timeout      body_timeout
    ├── PayloadTooLarge          413 payload_too_large
    ├── Unprocessable            422 validation_error
    ├── TooManyRequests          429 rate_limited
    │   ├── TenantOverShare      429 rate_limited         shed_tenant       limits.admission
    │   ├── RateLimited          429 rate_limit_exceeded  rate_limited      limits.quotas
    │   └── BudgetExceeded       429 budget_exceeded      budget_exceeded   limits.quotas
    └── ServiceUnavailable       503 unavailable
        ├── Saturated            503 overloaded           shed_process      limits.admission
        ├── BudgetUnknown        503 budget_unknown       unavailable       limits.quotas
        └── DeadlineExceeded     503 deadline_exceeded    deadline
    ClientGone                   499 (no body)            disconnect        a ConnectionResetError

The exceptions of others, as `failure_of` tells them (its branches are the table's rows, with
the message of the JSON error and, where it differs, of a stream's error event):

    EmptyDocument                422 validation_error     client_error      backends.retrieval
    BackendError                 500 internal_error       error (a bug)     backends.errors
    ├── BackendUnavailable       503 unavailable          unavailable
    └── UpstreamError            503 upstream_error       upstream_error
        └── UpstreamRefused      400 bad_request          client_error      if the client
                                                                            shaped the calls
    aiohttp's HTTPException      its own status                             http.failures
    any other exception          500 internal_error       error (a bug)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from backends.errors import BackendError, BackendUnavailable, UpstreamError, UpstreamRefused
from backends.retrieval.base import EmptyDocument

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
    at most `limit` characters, so a body-sized name does not make every refusal's response
    and log line as large as the body."""
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


@dataclass(frozen=True, slots=True)
class Failure:
    """How a request failed: its outcome, the JSON error the client gets, what the log says."""

    outcome: Outcome
    status: int
    kind: str
    message: str  # written for the client
    error: str | None  # for the log line (may carry a library's detail)
    retry_after_s: int | None = None
    bug: BaseException | None = None  # ours: its traceback goes to the log line
    # The error event's (type, message) when the failure comes after a stream's headers;
    # None: the JSON error's. Never a library's text (it can carry hosts, keys' names, bodies).
    in_stream: tuple[str, str] | None = None

    @property
    def streamed(self) -> tuple[str, str]:
        return self.in_stream or (self.kind, self.message)


def status_outcome(status: int) -> Outcome:
    if status == 503:
        return "unavailable"
    if status >= 500:
        return "error"
    if status >= 400:
        return "client_error"
    return "ok"


_NO_PASSAGE = "text: no passage to index (headings only?); add body text"
_REFUSED_AS_INVALID = (
    "the model refused this request as invalid: check its parameters, tools and messages "
    "(the model's reason is in the gateway's log under this request id)"
)
_INTERNAL = "internal error; see the gateway log"


def failure_of(exc: Exception, *, client_gone: bool, client_shaped: bool) -> Failure:
    """The failure an exception means, aiohttp's own HTTP exceptions aside.

    `client_gone`: the client's connection is closed. `client_shaped`: the client shaped the
    model calls (parameters, tools, tool results), so a model's refusal of them as invalid is
    the client's to fix (400), not an upstream failure (503)."""
    if isinstance(exc, GatewayError):
        error = exc.message if exc.detail is None else f"{exc.message}: {exc.detail}"
        outcome = exc.outcome or status_outcome(exc.status)
        return Failure(outcome, exc.status, exc.type, exc.message, error, exc.retry_after_s)
    if isinstance(exc, EmptyDocument):  # the backend's refusal, before any write
        return Failure("client_error", 422, "validation_error", _NO_PASSAGE, str(exc))
    if isinstance(exc, BackendUnavailable):
        message = f"{exc.backend} is unavailable; try again"
        streamed = ("unavailable", "a dependency is unavailable; try again")
        return Failure(
            "unavailable",
            503,
            "unavailable",
            message,
            str(exc),
            exc.retry_after_s,
            in_stream=streamed,
        )
    if isinstance(exc, UpstreamRefused) and client_shaped:
        return Failure("client_error", 400, "bad_request", _REFUSED_AS_INVALID, str(exc))
    if isinstance(exc, UpstreamError):
        message = f"{exc.backend} answered with an error; try again"
        streamed = ("upstream_error", "the model's upstream failed; try again")
        return Failure(
            "upstream_error", 503, "upstream_error", message, str(exc), 5, in_stream=streamed
        )
    if isinstance(exc, ClientGone) or (isinstance(exc, ConnectionError) and client_gone):
        return Failure("disconnect", 499, "disconnect", "", None)
    # Anything else (a ConnectionError not on the client's connection included) is our bug.
    streamed = (
        ("unavailable", "a dependency failed; try again")
        if isinstance(exc, BackendError)
        else ("internal_error", "the answer failed; try again")
    )
    error = "internal error"
    return Failure("error", 500, "internal_error", _INTERNAL, error, bug=exc, in_stream=streamed)
