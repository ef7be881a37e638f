"""The response cache: which answers may be reused, for whom, and how they are found.

Two tiers, looked up in order, both within one tenant and one scope (`gateway.cache.keys`):

1. exact: the normalised self-contained question; needs no embedding, so it is looked up
   before the query is embedded;
2. semantic: the query's embedding (the one the router computes anyway) against the nearest
   cached questions (`CacheStore.nearest`, a bounded candidate set). A neighbour is served when
   its similarity reaches the threshold of the route that answered it and no guard
   (`gateway.cache.guards`) tells the two questions apart.

Only answers `gateway.cache.policy` accepts are stored, with a fixed TTL and the tenant's entry
cap; concurrent identical misses compute once (`gateway.cache.single_flight`).

The store fails open: an error is counted (`querygate_cache_lookups_total{result="error"}`)
and the request is served uncached, never failed. An entry whose answer cannot be decoded is
deleted and never served. Each request counts one lookup result: exact, semantic, miss, error,
or bypass (`Cache-Control: no-cache`, OpenAI generation parameters, the client's tools or
tool results, a follow-up that could not be rewritten).

Exact, then semantic: the question's key covers the conversation the model reads (see
`gateway.cache.keys`); the semantic tier serves only entries of the probe's own scope.

The lookups pass the request's `spend` (its Redis time budget, `backends.redis_client`) to the
store; the writes, and a follower's polls for its leader's answer, pass none.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Literal

from backends.cache.base import CachedEntry, CacheStore, CorruptEntry
from backends.errors import BackendError
from backends.redis_client import RequestSpend
from backends.retrieval.base import Vector
from gateway.cache import guards
from gateway.cache.entry import answer_from_cache
from gateway.cache.policy import Refusal
from gateway.cache.single_flight import LEASE_S, HitTier, Lease, Payload, SingleFlight
from gateway.obs.metrics import Metrics
from gateway.settings import CacheConfig
from routers.types import Route

log = logging.getLogger(__name__)

# What one request's lookup counted (querygate_cache_lookups_total's `result`).
LookupResult = Literal["exact", "semantic", "miss", "error", "bypass"]
# Why a computed answer was not stored (querygate_cache_not_stored_total's `reason`).
NotStored = Literal[Refusal, "too_large"]


class StoreFailed(Exception):
    """The store failed (already logged and counted): serve this request uncached."""


@dataclass(slots=True)
class SemanticLookup:
    """What the semantic tier found: the served neighbour's answer (or None), and what the
    thresholds can be tuned from: the nearest similarity and the guards that refused."""

    payload: Payload | None = None
    similarity: float | None = None  # of the served neighbour
    nearest: float | None = None  # of the nearest neighbour, served or not
    question: str | None = None  # the cached question served
    refused: list[str] = field(default_factory=list)  # guard names, nearest first


class ResponseCache:
    def __init__(
        self, store: CacheStore | None, config: CacheConfig, metrics: Metrics, lease_s: float
    ) -> None:
        self._store = store
        self._config = config
        self._metrics = metrics
        # The store's claim is short and renewed while its leader computes (LEASE_S); an
        # in-process lead is dropped past `lease_s`, the request timeout.
        self.flights = (
            None
            if store is None
            else SingleFlight(
                store, config.single_flight_wait_s, min(LEASE_S, lease_s), stale_s=lease_s
            )
        )

    @property
    def enabled(self) -> bool:
        return self._store is not None

    @property
    def semantic_enabled(self) -> bool:
        return self._store is not None and self._config.semantic.enabled

    def count(self, result: LookupResult) -> None:
        self._metrics.cache_lookups.labels(result).inc()

    async def exact(
        self, tenant: str, key: str, *, spend: RequestSpend | None = None
    ) -> Payload | None:
        """The answer stored under `key`; raises StoreFailed when the store failed."""
        assert self._store is not None
        try:
            entry = await self._store.get(tenant, key, spend=spend)
        except CorruptEntry as exc:
            log.warning("corrupt cache entry deleted", extra={"error": str(exc)})
            return None
        except BackendError as exc:
            raise self._failed("lookup", exc) from exc
        if entry is None:
            return None
        return await self._decoded(tenant, entry, spend)

    async def exact_or_lead(
        self,
        tenant: str,
        key: str,
        *,
        deadline: float | None = None,
        spend: RequestSpend | None = None,
    ) -> tuple[Lease | None, tuple[Payload, HitTier] | None]:
        """The exact tier and single flight: the answer stored under `key` or the one a
        leader computing it shares (with its tier), else None and the lead this request now
        holds (None: it computes unled). `deadline`: the request's (a loop time), which bounds
        a follower's wait; `spend`: its Redis time budget. Raises StoreFailed, or BackendError
        for a claim."""
        flights = self.flights
        assert flights is not None
        if flights.leader_of(tenant, key) is not None:
            # This process computes it already: look it up, else follow (nothing to claim).
            payload = await self.exact(tenant, key, spend=spend)
            if payload is not None:
                return None, (payload, "exact")
            if (leader := flights.leader_of(tenant, key)) is not None:
                shared = await flights.follow(leader, deadline=deadline)
                return None, None if shared is None else (shared.payload, shared.tier)
        lease, payload = await flights.look_and_lead(
            tenant,
            key,
            lambda: self._exact_or_claim(tenant, key, spend),
            lambda: self.exact(tenant, key),
            deadline=deadline,
            spend=spend,
        )
        return lease, None if payload is None else (payload, "exact")

    async def _exact_or_claim(
        self, tenant: str, key: str, spend: RequestSpend | None
    ) -> tuple[Payload | None, bool | None]:
        """`exact` and, on a miss, the store's claim, in one call: (answer, None) or (None,
        claimed); (None, None) for an entry that could not be served (nothing claimed)."""
        assert self._store is not None and self.flights is not None
        lease_s = self.flights.lease_s
        try:
            entry, claimed = await self._store.get_or_claim(tenant, key, lease_s, spend=spend)
        except CorruptEntry as exc:
            log.warning("corrupt cache entry deleted", extra={"error": str(exc)})
            return None, None
        except BackendError as exc:
            raise self._failed("lookup", exc) from exc
        if entry is None:
            return None, claimed
        return await self._decoded(tenant, entry, spend), None

    async def semantic(
        self,
        tenant: str,
        scope: str,
        question: str,
        vector: Vector,
        *,
        spend: RequestSpend | None = None,
    ) -> SemanticLookup:
        """The nearest cached answer that may be served for `question`; raises StoreFailed."""
        assert self._store is not None
        found = SemanticLookup()
        semantic = self._config.semantic
        try:
            neighbours = await self._store.nearest(
                tenant, scope, vector, semantic.candidates, spend=spend
            )
        except CorruptEntry as exc:
            log.warning("corrupt cache entry deleted", extra={"error": str(exc)})
            neighbours = []
        except BackendError as exc:
            raise self._failed("semantic lookup", exc) from exc
        if not neighbours:
            return found
        found.nearest = neighbours[0].similarity
        self._metrics.cache_nearest_similarity.observe(max(0.0, found.nearest))
        probe = guards.facts(question)
        for neighbour in neighbours:
            if not neighbour.entry.key.startswith(scope + ":"):
                # Only the scope's own entries may answer (a store that mixed scopes up
                # would otherwise serve another configuration's or conversation's answer).
                log.warning("cache neighbour from another scope ignored")
                continue
            payload = await self._decoded(tenant, neighbour.entry, spend)
            if payload is None:
                continue
            threshold = semantic.thresholds.get(Route(payload["route"]))
            if threshold is None or neighbour.similarity < threshold:
                continue
            refusal = guards.refusal(probe, guards.facts(neighbour.entry.question))
            if refusal is not None:
                found.refused.append(refusal)
                self._metrics.cache_guard_refusals.labels(refusal).inc()
                continue
            found.payload, found.question = payload, neighbour.entry.question
            found.similarity = neighbour.similarity
            break
        return found

    def not_stored(self, reason: NotStored) -> None:
        """A computed answer not stored, and why."""
        self._metrics.cache_not_stored.labels(reason).inc()

    async def drain(self) -> None:
        """Wait for the cache writes and claim releases sent so far (tests)."""
        if self.flights is not None:
            await self.flights.drain()

    async def put(
        self,
        tenant: str,
        scope: str,
        key: str,
        question: str,
        payload: Payload,
        vector: Vector | None,
    ) -> None:
        assert self._store is not None
        searchable = self.semantic_enabled and len(question) <= guards.MAX_SEMANTIC_CHARS
        entry = CachedEntry(
            key, question, json.dumps(payload).encode(), vector if searchable else None
        )
        size = len(key.encode()) + len(question.encode()) + len(entry.payload)
        if size > self._config.max_entry_bytes:
            log.debug("answer not cached", extra={"why": "too_large", "bytes": size})
            self.not_stored("too_large")
            return
        store = self._store
        if self.flights is None:  # no store: nothing to write
            return

        async def write() -> None:
            try:
                await store.put(
                    tenant,
                    scope,
                    entry,
                    ttl_s=self._config.ttl_s,
                    max_entries=self._config.max_entries,
                )
            except BackendError as exc:
                log.warning("cache store failed", extra={"error": str(exc)})
            finally:
                if flights.writes.get((tenant, key)) is task:
                    del flights.writes[(tenant, key)]

        # Sent by a task of its own: the answer does not wait for its own storing. The key's
        # claim is released after it (SingleFlight.finish), and this process's followers get
        # the answer from the leader, not from the store.
        flights = self.flights
        task = flights.spawn(write())
        flights.writes[(tenant, key)] = task

    async def _decoded(
        self, tenant: str, entry: CachedEntry, spend: RequestSpend | None
    ) -> Payload | None:
        """The entry's answer; one that does not decode is deleted and never served."""
        try:
            payload = json.loads(entry.payload)
            if not isinstance(payload, dict):
                raise ValueError("not a cached answer")
            answer_from_cache(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("undecodable cache entry deleted", extra={"error": str(exc)})
            assert self._store is not None
            with contextlib.suppress(BackendError):  # else its TTL ends it
                await self._store.delete(tenant, entry.key, spend=spend)
            return None
        return payload

    def _failed(self, what: str, exc: BackendError) -> StoreFailed:
        log.warning(f"cache {what} failed, serving uncached", extra={"error": str(exc)})
        return StoreFailed()
