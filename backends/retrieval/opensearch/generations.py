"""Each tenant's generation counter: one document per tenant in `<alias>-meta`, bumped with
optimistic concurrency (sequence number and primary term), so no scripting is needed. Each
bump also records when it was made (`changed_at`): when the tenant's index last changed."""

from __future__ import annotations

import time

from opensearchpy import AsyncOpenSearch
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from backends.errors import BackendUnavailable
from backends.retrieval.opensearch.client import BACKEND, Json, translated
from backends.retrieval.opensearch.config import OpenSearchConfig


class _Conflict(Exception):
    """A concurrent writer bumped the generation first; read again and retry."""


class Generations:
    """Reads and bumps the tenants' generations of one retriever's meta index."""

    def __init__(self, client: AsyncOpenSearch, config: OpenSearchConfig) -> None:
        self._client = client
        self._config = config

    async def read(self, tenant: str) -> int:
        doc = await self._meta_doc(tenant)
        return int(doc["_source"]["generation"]) if doc else 0

    async def changed_at(self, tenant: str) -> float | None:
        """When the tenant's generation last moved (unix seconds); None: never, or before the
        time was recorded."""
        doc = await self._meta_doc(tenant)
        value = doc["_source"].get("changed_at") if doc else None
        return None if value is None else float(value)

    async def bump(self, tenant: str) -> int:
        """Increment the tenant's counter; a conflict with another writer reads it again."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Conflict), stop=stop_after_attempt(20), reraise=True
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._bump_once(tenant)
        except _Conflict as exc:
            raise BackendUnavailable(BACKEND, "generation: too many concurrent writers") from exc
        raise AssertionError("unreachable: tenacity reraises")

    async def _meta_doc(self, tenant: str) -> Json | None:
        with translated("generation"):
            # ignore=404: a tenant without changes is normal, not a warning in the client's log.
            doc = await self._client.get(index=self._config.meta_index, id=tenant, ignore=404)
        return doc if doc.get("found") else None

    async def _bump_once(self, tenant: str) -> int:
        doc = await self._meta_doc(tenant)
        guard: Json = {"op_type": "create"}
        value = 1
        if doc:
            guard = {"if_seq_no": doc["_seq_no"], "if_primary_term": doc["_primary_term"]}
            value = int(doc["_source"]["generation"]) + 1
        with translated("generation"):
            response = await self._client.index(
                index=self._config.meta_index,
                id=tenant,
                body={"generation": value, "changed_at": time.time()},
                params={**guard, "ignore": 409},
                request_timeout=self._config.write_timeout_s,
            )
        if response.get("status") == 409:
            raise _Conflict
        return value
