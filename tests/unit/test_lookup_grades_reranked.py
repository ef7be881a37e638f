"""The lookup grades the hits the rerank stage leaves, the ones its answer cites, not the fused
order the search returned."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from backends.retrieval.base import Hit, Retriever, SearchRequest
from routers import lookup
from routers.grading import EvidenceGrade
from routers.lookup import LookupParams, gather_evidence
from routers.rerank import RerankConfig, RerankStage
from routers.rules import EscalationConfig
from routers.types import Classification, Route, RouteContext, RouteDecision
from tests.fakes.rerank import FakeReranker

QUERY = "who designed the eiffel tower"
# Fused order: two near-tied pages (the rerank policy's margin), the answer second.
FUSED = [
    Hit("galileo", "galileo#0", "Galileo", "", "An astronomer of Pisa.", 0.030),
    Hit("eiffel", "eiffel#0", "Eiffel Tower", "", "Who designed the Eiffel Tower: Eiffel.", 0.029),
    Hit("paris", "paris#0", "Paris", "", "The capital of France.", 0.010),
]


class FixedRetriever:
    def __init__(self) -> None:
        self.requests: list[SearchRequest] = []

    async def search(self, request: SearchRequest) -> list[Hit]:
        self.requests.append(request)
        return FUSED[: request.k]


async def test_the_grade_reads_the_reranked_hits(monkeypatch: pytest.MonkeyPatch) -> None:
    graded: list[list[Hit]] = []

    def assess(query: str, hits: list[Hit], *_: object) -> EvidenceGrade:
        graded.append(list(hits))
        return EvidenceGrade(True, 1.0, 1.0, "sufficient")

    monkeypatch.setattr(lookup, "assess", assess)
    stage = RerankStage(RerankConfig(reranker="local", blend=0.0), FakeReranker(kind="local"))
    decision = RouteDecision(
        Route.LOOKUP, "classifier", "", Classification(Route.LOOKUP, 1.0), 1.0, 1.0
    )
    ctx = RouteContext("t", QUERY, np.zeros(4, dtype=np.float32), (), decision)
    retriever = FixedRetriever()
    params = LookupParams(k=2, candidates=50, grading=EscalationConfig())
    evidence = await gather_evidence(ctx, cast(Retriever, retriever), params, stage)
    assert retriever.requests[0].k == 10  # the stage's candidates are fetched, k are kept
    assert isinstance(evidence, list)
    assert evidence[0].doc_id == "eiffel"  # the fused first, Galileo, was moved down
    assert graded == [evidence]
