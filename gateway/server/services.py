"""Building the backends a configuration names, and closing them in reverse order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

from backends.cache.base import CacheStore
from backends.cache.memory import MemoryCacheStore
from backends.cache.redis import RedisCacheStore
from backends.embeddings.coalescing import CoalescingEmbedder
from backends.embeddings.config import build_embedder
from backends.errors import BackendUnavailable
from backends.quotas.redis import RedisQuotaStore
from backends.redis_client import RedisConnection, RedisModeMismatch, RedisOptions
from backends.rerank.base import Reranker
from backends.rerank.local import LocalCrossEncoder
from backends.rerank.opensearch import OpenSearchReranker
from backends.retrieval.base import Retriever
from backends.retrieval.embedded import EmbeddedRetriever
from backends.retrieval.opensearch import OpenSearchRetriever, SharedChunksNotMigrated
from backends.retrieval.opensearch.client import open_client
from gateway.cache.background import DRAIN_S, PROCESS_WRITES
from gateway.core.services import Services
from gateway.ingest.progress import IngestRegistry
from gateway.ingest.shared_progress import SharedIngests
from gateway.limits.quotas import Quotas, warn_if_per_worker
from gateway.obs.metrics import Metrics
from gateway.settings import ConfigError, Settings

if TYPE_CHECKING:
    from backends.rerank.remote import RemoteReranker

log = logging.getLogger(__name__)


def build_reranker(settings: Settings) -> Reranker | None:
    """The reranker `retrieval.rerank.reranker` names (None: off); validation made sure its
    section is there."""
    config = settings.retrieval.rerank
    if config.reranker == "local":
        return LocalCrossEncoder()
    if config.reranker == "remote" and config.remote is not None:
        from backends.rerank.remote import RemoteReranker  # litellm's import: see open_services

        return RemoteReranker(config.remote)
    if config.reranker == "opensearch" and config.opensearch is not None:
        return OpenSearchReranker(open_client(settings.retrieval.opensearch), config.opensearch)
    return None


def build_retriever(settings: Settings, dimension: int) -> Retriever:
    if settings.retrieval.backend == "opensearch":
        config = settings.retrieval.opensearch
        if config.dimension != dimension:
            raise ConfigError(
                f"retrieval.opensearch.dimension is {config.dimension}, "
                f"but the embedding model gives {dimension}"
            )
        return OpenSearchRetriever(config.model_copy(update={"fusion": settings.retrieval.fusion}))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return EmbeddedRetriever(embedded_index_path(settings), fusion=settings.retrieval.fusion)


def embedded_index_path(settings: Settings) -> Path:
    """The embedded backend's index file, in the data directory."""
    return settings.data_dir / "index.sqlite3"


async def _bootstrap(retriever: Retriever) -> None:
    """Create OpenSearch's templates and indices at start-up, not on the first request. A
    layout that would serve wrong answers refuses to start; a node that is down only delays
    it (the first request retries, and /readyz says not ready meanwhile)."""
    if not isinstance(retriever, OpenSearchRetriever):
        return
    try:
        await retriever.ensure_index()
    except SharedChunksNotMigrated as exc:
        raise ConfigError(f"retrieval.opensearch.tenancy: {exc}") from exc
    except BackendUnavailable as exc:
        log.warning("OpenSearch not reachable at start-up", extra={"error": str(exc)})


def build_cache_store(
    settings: Settings, metrics: Metrics, redis: RedisConnection | None = None
) -> CacheStore | None:
    """memory: per process, its bytes on a gauge; redis: shared by the fleet, on the process's
    one connection (opened by open_services whenever the cache uses Redis); off: None."""
    if settings.cache.backend == "memory":
        return MemoryCacheStore(
            settings.cache.max_entries,
            max_bytes=settings.cache.memory_max_bytes,
            on_bytes=metrics.cache_memory_bytes.set,
        )
    if settings.cache.backend == "redis":
        if redis is None:
            raise ConfigError("cache.backend: redis needs the Redis connection")
        return RedisCacheStore(redis, settings.cache.max_entries)
    return None


def redis_options(settings: Settings) -> RedisOptions:
    c = settings.cache
    return RedisOptions(
        c.redis_url.get_secret_value(),
        socket_timeout_s=c.redis_socket_timeout_s,
        connect_timeout_s=c.redis_connect_timeout_s,
        max_connections=c.redis_max_connections,
        request_budget_s=c.redis_request_budget_s,
    )


def uses_redis(settings: Settings) -> bool:
    return settings.cache.backend == "redis" or settings.quotas.uses_redis(settings.cache.backend)


async def open_redis(settings: Settings) -> RedisConnection:
    """The process's one Redis connection (cache and quotas share it). Redis down at start
    only warns; a URL whose mode contradicts the server refuses to start."""
    redis = RedisConnection(redis_options(settings))
    try:
        await redis.start()
    except RedisModeMismatch as exc:
        await redis.aclose()
        raise ConfigError(f"cache.redis_url: {exc}") from exc
    return redis


def build_quotas(settings: Settings, metrics: Metrics, redis: RedisConnection | None) -> Quotas:
    """In Redis when `quotas` says so (shared by every replica), else per process."""
    shared = (
        RedisQuotaStore(redis)
        if redis is not None and settings.quotas.uses_redis(settings.cache.backend)
        else None
    )
    quotas = Quotas(shared, metrics, retry_s=settings.quotas.redis_retry_s)
    warn_if_per_worker(settings.tenants, quotas)
    return quotas


@asynccontextmanager
async def open_services(settings: Settings, metrics: Metrics) -> AsyncIterator[Services]:
    async with AsyncExitStack() as stack:
        embedder = CoalescingEmbedder(build_embedder(settings.embeddings))
        stack.push_async_callback(embedder.aclose)
        retriever = build_retriever(settings, embedder.dimension)
        stack.push_async_callback(retriever.aclose)
        await _bootstrap(retriever)
        redis = await open_redis(settings) if uses_redis(settings) else None
        if redis is not None:
            stack.push_async_callback(redis.aclose)
        quotas = build_quotas(settings, metrics, redis)
        stack.push_async_callback(quotas.aclose)
        # Imported here, with litellm under it (seconds of CPU): the one-shot commands import
        # this module for its other builders and never build a litellm tier.
        from backends.llm.tiers import LiteLLMTiers

        tiers = LiteLLMTiers(
            settings.models.small,
            settings.models.large,
            on_cooldown=lambda tier, model, is_open: metrics.llm_cooldown_open.labels(
                tier, model
            ).set(1 if is_open else 0),
            on_tenant_cooldowns=lambda tier, model, n: metrics.llm_tenant_cooldowns.labels(
                tier, model
            ).set(n),
        )
        stack.push_async_callback(tiers.aclose)
        await tiers.warm_up()
        cache_store = build_cache_store(settings, metrics, redis)
        if cache_store is not None:
            stack.push_async_callback(cache_store.aclose)
        # Before the store closes (callbacks run last first): the answers' last writes.
        stack.push_async_callback(PROCESS_WRITES.drain, DRAIN_S)
        reranker = build_reranker(settings)
        if reranker is not None:
            stack.push_async_callback(reranker.aclose)
            if settings.retrieval.rerank.reranker == "remote":
                await cast("RemoteReranker", reranker).warm_up()
            log.info("rerank: %s reranker, model %s", reranker.kind, reranker.model_id)
        # Another process's first ingest of a tenant (`querygate ingest`) is seen through it.
        ingests = IngestRegistry(SharedIngests(settings.data_dir))
        yield Services(embedder, retriever, tiers, cache_store, metrics, quotas, ingests, reranker)
