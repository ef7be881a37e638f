"""The rerank rows of `querygate eval retrieval`, when a reranker is configured: each question's
fused hits reranked, scored beside fusion alone, so an operator can check the reranker on their
own labelled questions before turning it on.

Two rows: `hybrid+rerank`, every question reranked (`when: always`: what the reranker can do),
and `hybrid+policy`, reranked only where the configured policy would (what the deployment would
serve); each with its paired difference from fusion (the same resampled questions), the policy's
decisions and what the calls cost. The reranker is called once per question: the policy's row
takes the reranked order where it decides to rerank and the fused order elsewhere. A reranker
that fails stops the evaluation (a row with fused orders in it would pass for the reranker's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.errors import BackendUnavailable
from backends.rerank.base import Reranker
from backends.retrieval.base import Hit
from gateway.eval.examples import RetrievalExample
from gateway.eval.stats import document_ranks, estimate, recall_at, reciprocal_rank
from routers.rerank import RerankCall, RerankConfig, RerankStage, RerankTrace, fused_margin

ROWS = ("hybrid+rerank", "hybrid+policy")
EVAL_TIMEOUT_S = 30.0


class _Calls:
    """The rerank stage's recorder for one evaluation: decisions, and what they cost."""

    def __init__(self) -> None:
        self.last: RerankTrace | None = None
        self.cost_usd = 0.0

    def record(self, trace: RerankTrace) -> None:
        self.last = trace

    def spend(self, usd: float) -> None:
        self.cost_usd += usd


class RerankRows:
    def __init__(self, config: RerankConfig, reranker: Reranker, k: int, depth: int) -> None:
        # Quality, not latency, is measured: the policy's timeout would turn a slow call into a
        # failure that stops the run.
        always = config.model_copy(update={"when": "always", "timeout_s": EVAL_TIMEOUT_S})
        self._always = RerankStage(always, reranker)
        self._policy = RerankStage(config, reranker)
        self._reranker = reranker
        self._k = k
        self._depth = depth
        self._calls = _Calls()
        self._recall: dict[str, list[float]] = {row: [] for row in ROWS}
        self._rr: dict[str, list[float]] = {row: [] for row in ROWS}
        self._decisions: Counter[str] = Counter()

    def fetch(self) -> int:
        """How deep the fused search goes: the reranker's candidates, or the scored depth."""
        return self._always.fetch_k(self._depth)

    async def add(self, tenant: str, example: RetrievalExample, hits: Sequence[Hit]) -> None:
        """Score one question's fused `hits` reranked."""
        call = RerankCall(tenant, example.question, hits, self._depth, "lookup", self._calls)
        reranked = await self._always.rerank(call)
        trace = self._calls.last
        if trace is not None and trace.decision == "failed":
            raise BackendUnavailable("rerank", f"line {example.line}: {trace.detail}")
        decision = self._policy.decide(hits, fused_margin(hits), example.question) or "reranked"
        self._decisions[decision] += 1
        chosen = reranked if decision == "reranked" else list(hits[: self._depth])
        for row, ranked in zip(ROWS, (reranked, chosen), strict=True):
            ranks = document_ranks([h.doc_id for h in ranked])
            self._recall[row].append(recall_at(ranks, example.relevant, self._k))
            self._rr[row].append(reciprocal_rank(ranks, example.relevant))

    def report(self, hybrid_recall: Sequence[float], hybrid_rr: Sequence[float]) -> dict[str, Any]:
        recall = {row: np.array(values) for row, values in self._recall.items()}
        rr = {row: np.array(values) for row, values in self._rr.items()}
        return {
            "reranker": self._reranker.kind,
            "model": self._reranker.model_id,
            "arms": {
                row: {
                    "recall_at_k": estimate(recall[row]).as_dict(),
                    "mrr_at_10": estimate(rr[row]).as_dict(),
                }
                for row in ROWS
            },
            # Paired: the same resampled questions for the row and fusion alone.
            "minus_hybrid": {
                row: {
                    "recall_at_k": estimate(recall[row] - np.array(hybrid_recall)).as_dict(),
                    "mrr_at_10": estimate(rr[row] - np.array(hybrid_rr)).as_dict(),
                }
                for row in ROWS
            },
            "policy_decisions": dict(sorted(self._decisions.items())),
            "cost_usd": round(self._calls.cost_usd, 8),
        }
