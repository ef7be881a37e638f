"""`_bulk` requests: bounded batches, and bounded retries of the items a busy node rejects.

A batch never splits an operation (an index or update line and its body). Items rejected with
429/5xx go again, alone; an update of a chunk that is gone or changed under it (404, 409) fails
the write with `WriteRaced` (a concurrent writer of the same document deleted or flipped it); any
other rejection fails the write with `UpstreamError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from opensearchpy import AsyncOpenSearch
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from backends.errors import BackendUnavailable, UpstreamError
from backends.retrieval.opensearch.client import BACKEND, Json, is_transient, translated
from backends.retrieval.opensearch.config import OpenSearchConfig


class _RetryableBulk(Exception):
    """Some bulk items were rejected with 429/5xx; `pending` holds them for the next attempt."""

    def __init__(self, pending: list[Json]) -> None:
        super().__init__(f"{len(pending)} bulk lines to retry")
        self.pending = pending


class WriteRaced(UpstreamError):
    """An update found its chunk deleted (404: another writer of the same document flipped
    between this write's staging and its flip, and removed the staged chunk as stale) or
    changed while it applied (409). The write is retried from a fresh read of what is stored
    (`Writes`)."""


class Bulk:
    """Sends bulk lines (action+source pairs, lone deletes) for one retriever."""

    def __init__(self, client: AsyncOpenSearch, config: OpenSearchConfig) -> None:
        self._client = client
        self._config = config

    async def send(self, ops: Sequence[Json], refresh: str | None = None) -> None:
        """Send `ops` in bounded, retried batches."""
        for batch in _batches(ops, self._config.bulk_batch_size):
            await self.send_whole(batch, refresh)

    async def send_whole(self, batch: list[Json], refresh: str | None = None) -> None:
        """Send `batch` as one request (items the node rejects as busy go again, alone)."""
        try:
            await self._with_retries(batch, refresh or self._config.write_refresh)
        except _RetryableBulk as exc:
            attempts = self._config.bulk_max_attempts
            raise BackendUnavailable(BACKEND, f"bulk: {exc} after {attempts} attempts") from exc

    async def _with_retries(self, batch: list[Json], refresh: str) -> None:
        pending = batch
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type((_RetryableBulk, BackendUnavailable)),
            stop=stop_after_attempt(self._config.bulk_max_attempts),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        ):
            with attempt:
                try:
                    await self._once(pending, refresh)
                except _RetryableBulk as exc:
                    # Only the rejected operations go again; the rest are already stored.
                    pending = exc.pending
                    raise

    async def _once(self, lines: list[Json], refresh: str) -> None:
        with translated("bulk"):
            response = await self._client.bulk(
                body=lines,
                refresh=refresh,
                request_timeout=self._config.write_timeout_s,
            )
        if not response["errors"]:
            return
        retry: list[Json] = []
        for op, item in zip(_operations(lines), response["items"], strict=True):
            result = next(iter(item.values()))
            status = int(result.get("status", 500))
            if status < 300 or (status == 404 and "delete" in item):
                continue
            if is_transient(status):
                retry += op
                continue
            if status in (404, 409) and "update" in item:
                raise WriteRaced(BACKEND, f"bulk update raced another write: {result.get('error')}")
            raise UpstreamError(BACKEND, f"bulk item rejected: {result.get('error')}")
        if retry:
            raise _RetryableBulk(retry)


def delete_ops(index: str, ids: Sequence[str]) -> list[Json]:
    return [{"delete": {"_index": index, "_id": key}} for key in ids]


def _operations(lines: list[Json]) -> Iterator[list[Json]]:
    """Group bulk lines into operations: delete stands alone, index and update carry a body."""
    i = 0
    while i < len(lines):
        width = 1 if "delete" in lines[i] else 2
        yield lines[i : i + width]
        i += width


def _batches(lines: Sequence[Json], size: int) -> Iterator[list[Json]]:
    batch: list[Json] = []
    for op in _operations(list(lines)):
        batch += op
        if len(batch) >= 2 * size:
            yield batch
            batch = []
    if batch:
        yield batch
