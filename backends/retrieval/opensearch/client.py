"""The pooled opensearch-py client of one retriever, and its exceptions as the backend seam's.

Every call has a bounded timeout and no transport retries, so a down or slow node surfaces as
`BackendUnavailable` quickly; only bulk writes retry (bounded) on 429/5xx (`bulk.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError

from backends.errors import BackendUnavailable, UpstreamError
from backends.retrieval.opensearch.config import OpenSearchConfig

BACKEND = "opensearch"
Json = dict[str, Any]


def open_client(config: OpenSearchConfig) -> AsyncOpenSearch:
    return AsyncOpenSearch(
        hosts=list(config.hosts),
        timeout=config.search_timeout_s,
        maxsize=config.max_connections,
        # Failing fast beats retrying on the caller's latency budget; bulk retries itself.
        max_retries=0,
        retry_on_timeout=False,
    )


@contextmanager
def translated(operation: str) -> Iterator[None]:
    """Turn opensearch-py's exceptions into the backend seam's errors."""
    try:
        yield
    except OSConnectionError as exc:  # includes ConnectionTimeout
        raise BackendUnavailable(BACKEND, f"{operation}: {type(exc).__name__}") from exc
    except TransportError as exc:
        status = exc.status_code
        if isinstance(status, int) and is_transient(status):
            raise BackendUnavailable(BACKEND, f"{operation}: HTTP {status}") from exc
        raise UpstreamError(BACKEND, f"{operation}: HTTP {status} {exc.error}") from exc


def is_transient(status: int) -> bool:
    """Overload (429) or a server-side failure: worth a retry, and the caller's 503."""
    return status == 429 or status >= 500


def error_type(exc: TransportError) -> str | None:
    info = exc.info
    if isinstance(info, dict) and isinstance(info.get("error"), dict):
        return str(info["error"].get("type"))
    return None
