"""The backends the request core uses, built once per process and shared by every pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.cache.base import CacheStore
from backends.embeddings.base import Embedder
from backends.llm.base import LLM
from backends.rerank.base import Reranker
from backends.retrieval.base import Retriever
from gateway.ingest.progress import IngestRegistry
from gateway.limits.quotas import Quotas
from gateway.obs.metrics import Metrics


@dataclass(frozen=True, slots=True)
class Services:
    """The backends, built once per process and shared by every pipeline (and config)."""

    embedder: Embedder
    retriever: Retriever
    llm: LLM
    cache_store: CacheStore | None
    metrics: Metrics
    quotas: Quotas | None = None  # the tenants' rate limits and budgets (gateway/limits/quotas.py)
    # The ingests this process runs, by tenant: answers from a partial index say so.
    ingests: IngestRegistry = field(default_factory=IngestRegistry)
    # The second stage of retrieval (`retrieval.rerank.reranker`); None: off.
    reranker: Reranker | None = None
