"""The response cache's pipeline stages: the exact tier (with single flight), the semantic
tier, storing a computed answer and ending a request's lead.

The core runs them in its stage order: the exact tier needs no embedding, so it runs before
one is paid for; the semantic tier reuses the embedding the router needs anyway. They read what
a request asks through `Asked` (the core's request satisfies it) and keep what they learn in
the request's `CacheState`; the tiers' rules are `gateway.cache.response`'s. The lookups take
the request's deadline and its Redis time budget (`RequestSpend`) as plain arguments.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from backends.cache.base import CacheStore
from backends.embeddings.base import Embedder, token_window
from backends.errors import BackendError
from backends.llm.base import GenerationOptions, Message
from backends.redis_client import RequestSpend
from backends.retrieval.access import Groups
from backends.retrieval.base import Retriever, Vector
from gateway.cache import policy as cache_policy
from gateway.cache.entry import answer_from_cache, answer_to_cache
from gateway.cache.guards import MAX_SEMANTIC_CHARS
from gateway.cache.keys import (
    CacheScope,
    access_digest,
    answer_config_version,
    display_question,
    exact_key,
    history_digest,
    options_digest,
)
from gateway.cache.response import LookupResult, ResponseCache, SemanticLookup, StoreFailed
from gateway.cache.single_flight import HitTier, Lease, Payload, Shared
from gateway.obs.metrics import Metrics
from gateway.obs.timing import StageTimer
from gateway.settings import Settings, TenantConfig
from routers.rewrite import looks_like_followup
from routers.types import Answer

log = logging.getLogger(__name__)

# A hit: the cached answer and the route reason it was stored with.
Served = tuple[Answer, str]
# The tier that answered a request: none (a miss, computed), or the one it was found in.
CacheTier = Literal["miss"] | HitTier


class Asked(Protocol):
    """What the cache stages read of a request."""

    @property
    def id(self) -> str: ...
    @property
    def tenant(self) -> TenantConfig: ...
    @property
    def query(self) -> str: ...
    @property
    def history(self) -> tuple[Message, ...]: ...
    @property
    def route(self) -> str: ...
    @property
    def original_query(self) -> str | None: ...
    @property
    def cache_lookup(self) -> bool: ...
    @property
    def cache_store(self) -> bool: ...
    @property
    def options(self) -> GenerationOptions: ...
    @property
    def trailing(self) -> tuple[Message, ...]: ...


@dataclass(slots=True)
class CacheState:
    """What the cache stages learned about one request."""

    # The key and scope while this request may be stored, and the question they file.
    key: str | None = None
    scope: str | None = None
    question: str | None = None
    tier: CacheTier = "miss"
    result: LookupResult | None = None  # the lookup result counted, once
    looking: bool = False  # the exact tier missed cleanly: the semantic tier may look
    # The question's vector may be compared (not too long, no token its embedder did not
    # know): else it is looked up and stored for the exact tier only.
    searchable: bool = True
    semantic: SemanticLookup | None = None
    flight: Lease | None = None  # this request leads its key's single flight
    shared: Shared | None = None  # what its followers get: the answer it stored or was served

    def debug(self) -> dict[str, Any] | None:
        """For `debug`: the lookup's result and, for the semantic tier, what it compared."""
        if self.result is None:
            return None
        body: dict[str, Any] = {"lookup": self.result}
        if (found := self.semantic) is not None:
            body["nearest_similarity"] = found.nearest
            body["refused_by"] = found.refused
            if found.payload is not None:
                body["similarity"] = found.similarity
                body["cached_question"] = found.question
        return body

    def log_fields(self) -> dict[str, Any]:
        """The lookup on the request's log line: its result, and for the semantic tier what
        its thresholds are tuned from."""
        fields: dict[str, Any] = {"cache_lookup": self.result} if self.result else {}
        if (found := self.semantic) is not None:
            fields["cache_nearest_similarity"] = found.nearest
            if found.refused:
                fields["cache_refused_by"] = found.refused
        return fields


class CacheStages:
    def __init__(
        self,
        store: CacheStore | None,
        retriever: Retriever,
        embedder: Embedder,
        metrics: Metrics,
        settings: Settings,
    ) -> None:
        self.response = ResponseCache(
            store if settings.cache.backend != "off" else None,
            settings.cache,
            metrics,
            # A leader's claim outlives no request: past its deadline nobody waits for it.
            lease_s=settings.server.request_timeout_s,
        )
        self._retriever = retriever
        self._embedder = embedder
        self._settings = settings
        self._answer_configs: dict[str, str] = {}  # per tenant: what answers depend on

    def wants_vector(self, state: CacheState) -> bool:
        """Whether the semantic tier will compare the question's embedding."""
        return self.response.semantic_enabled and state.key is not None

    async def exact(
        self,
        state: CacheState,
        asked: Asked,
        groups: Groups,
        timer: StageTimer,
        deadline: float | None,
        spend: RequestSpend | None,
    ) -> Served | None:
        """The exact tier. An exact hit needs no embedding: answer before paying for one. A
        miss waits for the same question's answer when another request is computing it (as
        `SingleFlight` bounds the wait by the request's `deadline`, a loop time), or leads
        that computation itself. `groups`: the end user's, part of the scope (so of the
        semantic tier's and the single flight's too): users in other groups may see other
        documents, and never share an answer. `spend`: the request's Redis time budget."""
        if not self.response.enabled:
            return None
        if asked.original_query is None and looks_like_followup(asked.query, asked.history):
            # Not rewritten: its meaning lies in a conversation no key holds.
            self._count(state, "bypass")
            return None
        tool_turns = asked.trailing or any(m.role == "tool" or m.tool_calls for m in asked.history)
        if asked.options.tools or tool_turns:
            # The client's own tools: the answer may be a call of them, or rest on their
            # results, for this client only.
            self._count(state, "bypass")
            return None
        with timer.stage("cache_lookup"):
            scope = await self._scope(asked, groups)
            if scope is None:
                self._count(state, "error")
                return None
            state.question = display_question(asked.query)
            state.key, state.scope = exact_key(scope, state.question), scope.digest
            if not asked.cache_lookup:
                self._count(state, "bypass")
                return None
            try:
                state.flight, found = await self.response.exact_or_lead(
                    asked.tenant.id, state.key, deadline=deadline, spend=spend
                )
            except (StoreFailed, BackendError) as exc:
                if isinstance(exc, BackendError):  # the claim; StoreFailed is logged already
                    log.warning("cache claim failed, serving uncached", extra={"error": str(exc)})
                self._count(state, "error")
                state.key = None  # nor store into a store that fails: serve uncached
                return None
        if found is not None:
            return self._hit(state, *found)
        state.looking = True
        return None

    async def semantic(
        self,
        state: CacheState,
        asked: Asked,
        vector: Vector | None,
        timer: StageTimer,
        spend: RequestSpend | None,
    ) -> Served | None:
        """The semantic tier, on the embedding the router needs anyway: the nearest cached
        question's answer when it is close enough for its route and no guard objects.
        `spend`: the request's Redis time budget."""
        if not state.looking:
            return None
        state.looking = False
        assert state.question is not None and state.scope is not None
        state.searchable = self._searchable(state.question)
        if not self.response.semantic_enabled or not state.searchable:
            self._count(state, "miss")
            return None
        assert vector is not None
        with timer.stage("cache_semantic"):
            try:
                found = await self.response.semantic(
                    asked.tenant.id, state.scope, state.question, vector, spend=spend
                )
            except StoreFailed:
                self._count(state, "error")
                state.key = None
                return None
        state.semantic = found
        log.debug(
            "semantic cache lookup",
            extra={
                "request_id": asked.id,
                "cache_nearest_similarity": found.nearest,
                "cache_similarity": found.similarity,
                "cache_refused": found.refused,
            },
        )
        if found.payload is None:
            self._count(state, "miss")
            return None
        return self._hit(state, found.payload, "semantic")

    async def store(
        self,
        state: CacheState,
        asked: Asked,
        answer: Answer,
        reason: str,
        vector: Vector | None,
        timer: StageTimer,
    ) -> None:
        """Store a computed answer the policy accepts, unless the client said no-store."""
        if state.key is None or state.tier != "miss" or not asked.cache_store:
            return
        assert state.scope is not None and state.question is not None
        if (refused := cache_policy.refusal(answer)) is not None:
            log.debug("answer not cached", extra={"request_id": asked.id, "why": refused})
            self.response.not_stored(refused)
            return
        payload = answer_to_cache(answer, reason)
        with timer.stage("cache_store"):
            await self.response.put(
                asked.tenant.id,
                state.scope,
                state.key,
                state.question,
                payload,
                vector if state.searchable else None,
            )
        state.shared = Shared(payload, "exact")

    async def release(self, state: CacheState) -> None:
        """End the request's single-flight lead, if it holds one: followers get its stored
        answer or compute their own, and the store's claim is given back. Idempotent."""
        if self.response.flights is None or state.flight is None:
            return
        state.flight, lease = None, state.flight
        await self.response.flights.finish(lease, state.shared)

    async def _scope(self, asked: Asked, groups: Groups) -> CacheScope | None:
        try:
            generation = await self._retriever.generation(asked.tenant.id)
        except BackendError as exc:
            # Without the generation no key is safe; serve uncached (routes that need no
            # retrieval still answer), never a possibly stale answer.
            log.warning("index generation unavailable, cache bypassed", extra={"error": str(exc)})
            return None
        return CacheScope(
            requested_route=asked.route,
            generation=generation,
            config_version=self._answer_config(asked.tenant),
            embedding_model=self._embedder.model_id,
            options=options_digest(asked.options),
            history=history_digest(asked.history),
            access=access_digest(groups),
        )

    def _answer_config(self, tenant: TenantConfig) -> str:
        version = self._answer_configs.get(tenant.id)
        if version is None:
            version = answer_config_version(self._settings, tenant)
            self._answer_configs[tenant.id] = version
        return version

    def _searchable(self, question: str) -> bool:
        """Whether the semantic tier may compare this question's vector: not past the guards'
        bound, and every token known to the embedder's tokenizer (text in a script it does not
        know, Thai, Amharic, emoji only, becomes [UNK] tokens whose vectors are all alike)."""
        if len(question) > MAX_SEMANTIC_CHARS:
            return False
        window = token_window(self._embedder)
        return window is None or window.unknown is None or window.unknown(question) == 0

    def _hit(self, state: CacheState, payload: Payload, tier: HitTier) -> Served:
        served = answer_from_cache(payload)
        state.tier, state.key, state.shared = tier, None, Shared(payload, tier)
        self._count(state, tier)
        return served

    def _count(self, state: CacheState, result: LookupResult) -> None:
        if state.result is None:
            state.result = result
            self.response.count(result)
