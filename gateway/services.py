"""Building the backends a configuration names, and closing them in reverse order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from backends.cache.base import CacheStore
from backends.cache.memory import MemoryCacheStore
from backends.embeddings.coalescing import CoalescingEmbedder
from backends.embeddings.config import build_embedder
from backends.errors import BackendUnavailable
from backends.llm.litellm_tiers import LiteLLMTiers
from backends.retrieval.base import Retriever
from backends.retrieval.embedded import EmbeddedRetriever
from backends.retrieval.opensearch import OpenSearchRetriever, SharedChunksNotMigrated
from gateway.metrics import Metrics
from gateway.pipeline import Services
from gateway.settings import ConfigError, Settings

log = logging.getLogger(__name__)


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
    return EmbeddedRetriever(settings.data_dir / "index.sqlite3", fusion=settings.retrieval.fusion)


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


def build_cache_store(settings: Settings) -> CacheStore | None:
    if settings.cache.backend == "memory":
        return MemoryCacheStore(settings.cache.max_entries)
    return None


@asynccontextmanager
async def open_services(settings: Settings, metrics: Metrics) -> AsyncIterator[Services]:
    async with AsyncExitStack() as stack:
        embedder = CoalescingEmbedder(build_embedder(settings.embeddings))
        stack.push_async_callback(embedder.aclose)
        retriever = build_retriever(settings, embedder.dimension)
        stack.push_async_callback(retriever.aclose)
        await _bootstrap(retriever)
        llm = LiteLLMTiers(
            settings.models.small,
            settings.models.large,
            on_cooldown=lambda tier, model, is_open: metrics.llm_cooldown_open.labels(
                tier, model
            ).set(1 if is_open else 0),
        )
        stack.push_async_callback(llm.aclose)
        await llm.warm_up()
        cache_store = build_cache_store(settings)
        if cache_store is not None:
            stack.push_async_callback(cache_store.aclose)
        yield Services(embedder, retriever, llm, cache_store, metrics)
