"""What a failed model call means: retry it, try the next model, or tell the caller.

A transient failure (connection errors, timeouts, 429, 5xx) is retried on the same model; a
malformed answer (a body that is not JSON, or not of OpenAI's shape) and a refused request (4xx
other than 429) go on to the next model of the chain, which may be another provider. When every
model failed, `exhausted` names the error the caller gets: `BackendUnavailable` if any failed
transiently or is cooling down (trying later may help), `UpstreamRefused` if every model refused
the request's content, else `UpstreamError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from enum import Enum

import openai

from backends.errors import BackendUnavailable, UpstreamError, UpstreamRefused
from backends.llm import openai_http
from backends.llm.base import Tier

# What a failed attempt may raise; anything else is a bug and propagates untouched.
CALL_ERRORS = (openai.APIError, TimeoutError, UpstreamError, openai_http.WireError)

# Statuses that fault the request's content; 401, 403 and 404 fault the deployment's key or
# model name instead (the operator's to fix).
_INVALID_REQUEST = frozenset({400, 413, 422})


class Failure(Enum):
    TRANSIENT = "transient"  # retry the same model
    MALFORMED = "malformed"  # the upstream answered garbage: try the next model
    REJECTED = "rejected"  # the upstream refused the request: try the next model


def classify(exc: BaseException) -> Failure:
    """What kind of failure this is, looking through litellm's re-wrapping.

    litellm maps a refused connection and an unparsable 200 body to `InternalServerError` (500)
    just like a real 500, so the original exception in the chain decides.
    """
    chain = _exception_chain(exc)
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        return Failure.MALFORMED
    if isinstance(exc, UpstreamError):
        return Failure.MALFORMED
    if any(
        isinstance(e, openai.APIConnectionError | TimeoutError | ConnectionError) for e in chain
    ):
        return Failure.TRANSIENT
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status == 429 or status >= 500):
        return Failure.TRANSIENT
    return Failure.REJECTED


def is_transient(exc: BaseException) -> bool:
    return classify(exc) is Failure.TRANSIENT


def verdict(exc: BaseException) -> bool | None:
    """A failed call's verdict on the model: none when the request itself was refused."""
    return None if classify(exc) is Failure.REJECTED else False


def exhausted(
    tier: Tier,
    failures: Sequence[tuple[str, BaseException]],
    cooling: Sequence[tuple[str, float]],
) -> Exception:
    """The error for a tier whose every model failed (`failures`, by model name) or was
    skipped (`cooling`: each model's name and seconds until it may be probed)."""
    if not failures:
        return BackendUnavailable(
            "llm",
            f"tier {tier!r} is cooling down: all its models failed recently",
            retry_after_s=_retry_after(cooling),
        )
    detail = f"tier {tier!r}: " + "; ".join(
        [f"{name}: {classify(exc).value}" for name, exc in failures]
        + [f"{name}: cooling down" for name, _ in cooling]
    )
    if cooling:
        return BackendUnavailable("llm", detail, retry_after_s=_retry_after(cooling))
    if any(is_transient(exc) for _, exc in failures):
        return BackendUnavailable("llm", detail)
    if all(_refused_as_invalid(exc) for _, exc in failures):
        return UpstreamRefused("llm", detail)
    return UpstreamError("llm", detail)


def _retry_after(cooling: Sequence[tuple[str, float]]) -> int:
    # Retry-After is whole seconds; a half-open model (0 s left) is busy with its probe
    return max(1, math.ceil(min(seconds for _, seconds in cooling)))


def _refused_as_invalid(exc: BaseException) -> bool:
    status = getattr(exc, "status_code", None)
    return classify(exc) is Failure.REJECTED and status in _INVALID_REQUEST


def _exception_chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
