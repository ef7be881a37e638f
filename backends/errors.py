"""Errors a backend raises at its seam, translated from its client's own exceptions.

Callers catch these, never `opensearchpy.TransportError` or `redis.ConnectionError`.
"""


class BackendError(Exception):
    """Base of every backend failure."""


class BackendUnavailable(BackendError):
    """The dependency is down, refusing, or too slow: the caller answers 503 with Retry-After."""

    def __init__(self, backend: str, detail: str, retry_after_s: int = 5) -> None:
        super().__init__(f"{backend} unavailable: {detail}")
        self.backend = backend
        self.retry_after_s = retry_after_s


class UpstreamError(BackendError):
    """The dependency answered, but with something unusable (bad body, rejected request)."""

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"{backend} error: {detail}")
        self.backend = backend


class UpstreamRefused(UpstreamError):
    """Every model tried refused the request itself as invalid (HTTP 400, 413 or 422): its
    content (parameters, tools, messages), not the upstream, is at fault, and a retry of the
    same request fails the same way."""
