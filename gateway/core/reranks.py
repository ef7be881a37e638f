"""One request's rerank decisions, kept as the request's: its stage timings, the metrics, its
`debug` block, and what a paid reranker cost, charged to its own tenant.

The rerank stage (`routers.rerank`) hands each decision here (the lookup's, and each of the
agent's searches); nothing of it is shared between requests, so one tenant's `debug` and
usage never show another's reranks or their cost.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from backends.llm.base import Usage
from gateway.limits.quotas import Quotas
from gateway.obs.metrics import Metrics
from gateway.obs.timing import StageTimer
from gateway.settings import TenantConfig
from routers.rerank import RerankTrace, failure_notes

# The key of the rerank's cost in an answer's `usage.by_tier`, beside the model tiers'.
RERANK_USAGE = "rerank"


class RequestReranks:
    """The `RerankRecorder` of one request."""

    def __init__(
        self,
        metrics: Metrics,
        timer: StageTimer,
        tenant: TenantConfig,
        quotas: Quotas | None,
        model: str,
    ) -> None:
        self._metrics = metrics
        self._timer = timer
        self._tenant = tenant
        self._quotas = quotas
        self._model = model  # the configured reranker's, for the cost metric
        self.traces: list[RerankTrace] = []
        self.cost_usd = 0.0

    def record(self, trace: RerankTrace) -> None:
        self.traces.append(trace)
        self._metrics.rerank_decisions.labels(trace.decision).inc()
        if trace.reranker != "off":
            # A configured reranker's stage shows in timings_ms.rerank, its skips at ~0 ms.
            self._timer.add("rerank", trace.ms / 1000)
        if trace.called:
            self._metrics.rerank_duration.labels(trace.reranker).observe(trace.ms / 1000)

    def spend(self, usd: float) -> None:
        if not usd > 0:
            return
        self.cost_usd += usd
        self._metrics.rerank_cost.labels(self._model).inc(usd)
        if self._quotas is not None:
            self._quotas.record_spend_nowait(self._tenant, usd)

    @property
    def failed(self) -> bool:
        """Some rerank failed: the answer stands on the fused order (and is not cached)."""
        return any(t.decision == "failed" for t in self.traces)

    def notes(self) -> tuple[str, ...]:
        return failure_notes(self.traces)

    def usage(self) -> dict[str, Usage]:
        """The reranks' cost as a line of the answer's usage (none when nothing was paid)."""
        return {RERANK_USAGE: Usage(cost_usd=self.cost_usd)} if self.cost_usd > 0 else {}

    def debug(self) -> list[dict[str, Any]]:
        return [{**asdict(t), "fused_ranks": list(t.fused_ranks)} for t in self.traces]
