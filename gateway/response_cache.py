"""The response cache: which answers may be reused, for whom, and under which key.

A key scopes an answer to everything that could change it: the tenant, the requested route,
the tenant's index generation (so a document change retires the answers computed before it),
the configuration version, the embedding model, the conversation and the normalised query.
The store fails open: an error is counted and treated as a miss, never as a failed request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from dataclasses import dataclass
from typing import Any

from backends.cache.base import CachedEntry, CacheStore
from backends.errors import BackendError
from backends.llm.base import Message
from gateway.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CacheScope:
    tenant: str
    requested_route: str
    generation: int
    config_version: str
    embedding_model: str


def normalise_query(text: str) -> str:
    """Case, Unicode form and white space do not change a question; punctuation can."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def cache_key(scope: CacheScope, query: str, history: tuple[Message, ...]) -> str:
    material = json.dumps(
        [
            scope.tenant,
            scope.requested_route,
            scope.generation,
            scope.config_version,
            scope.embedding_model,
            [(m.role, m.content) for m in history],
            normalise_query(query),
        ],
        ensure_ascii=False,
    )
    # The tenant stays readable in the key so an operator can purge one tenant by prefix.
    # Client text is clean by now (gateway/text.py); a rewrite from the model may not be, so a
    # lone surrogate is hashed as it is rather than failing the request.
    digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()
    return f"qg:{scope.tenant}:{digest}"


class ResponseCache:
    def __init__(
        self, store: CacheStore | None, ttl_s: int, max_entries: int, metrics: Metrics
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._metrics = metrics

    @property
    def enabled(self) -> bool:
        return self._store is not None

    async def get(self, tenant: str, key: str) -> dict[str, Any] | None:
        if self._store is None:
            return None
        try:
            entry = await self._store.get(tenant, key)
            payload = None if entry is None else dict(json.loads(entry.payload))
        except (BackendError, ValueError) as exc:
            # CorruptEntry included: the store has deleted it; it is never served.
            log.warning("cache lookup failed, serving uncached", extra={"error": str(exc)})
            self._metrics.cache_lookups.labels("error").inc()
            return None
        self._metrics.cache_lookups.labels("miss" if payload is None else "exact").inc()
        return payload

    async def put(
        self, tenant: str, scope: str, key: str, question: str, payload: dict[str, Any]
    ) -> None:
        if self._store is None:
            return
        entry = CachedEntry(key, question, json.dumps(payload).encode())
        try:
            await self._store.put(
                tenant, scope, entry, ttl_s=self._ttl_s, max_entries=self._max_entries
            )
        except BackendError as exc:
            log.warning("cache store failed", extra={"error": str(exc)})
