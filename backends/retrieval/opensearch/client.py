"""The pooled opensearch-py client of one retriever, and its exceptions as the backend seam's.

The client knows every node in `hosts`. A call that finds its node gone (refused, reset) or
answering 502/503/504 goes again to another node, each other node at most once, and the failed
one is left out of the rotation for a while (opensearch-py's pool: 60 s, doubling while it stays
down, then tried again), so a dead node of a cluster costs a request one fast failed attempt,
not an error. A timeout is not retried: a node that is slow rather than gone would cost the
caller's latency budget again per node. Every call has a bounded timeout, so a cluster that
cannot answer surfaces as `BackendUnavailable` quickly; bulk writes also retry (bounded) the
items a node rejects with 429/5xx (`bulk.py`).
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
# What a node that is going away answers (a proxy before it, or the node while it stops).
RETRY_ON_STATUS = (502, 503, 504)


def open_client(config: OpenSearchConfig) -> AsyncOpenSearch:
    return AsyncOpenSearch(
        hosts=list(config.hosts),
        timeout=config.search_timeout_s,
        maxsize=config.max_connections,
        # Each other node once: a single-node config never retries.
        max_retries=len(config.hosts) - 1,
        retry_on_status=RETRY_ON_STATUS,
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
