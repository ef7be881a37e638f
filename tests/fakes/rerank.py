"""`FakeReranker`: the rerank seam (backends/rerank/base.py) in memory.

A scoring function decides each passage's score (by default the share of the query's words the
passage holds, the fake upstream's rule), every request is recorded for the test to read, and a
test can make it fail as a down reranker does, or charge a price per call. `Recorder` keeps what
the rerank stage records of a request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.errors import BackendUnavailable
from backends.rerank.base import RerankerKind, RerankRequest
from routers.rerank import RerankTrace

_WORD = re.compile(r"\w+")


def overlap(query: str, passage: str) -> float:
    wanted = set(_WORD.findall(query.lower()))
    return len(wanted & set(_WORD.findall(passage.lower()))) / len(wanted) if wanted else 0.0


@dataclass
class FakeReranker:
    score: Callable[[str, str], float] = overlap
    fail: bool = False
    price_usd: float = 0.0  # reported to `on_cost` per answered call
    kind: RerankerKind = "remote"
    model_id: str = "fake-rerank"
    requests: list[RerankRequest] = field(default_factory=list)

    async def scores(self, request: RerankRequest) -> list[float]:
        self.requests.append(request)
        if self.fail:
            raise BackendUnavailable("rerank", "the fake reranker is down")
        if not request.passages:
            return []
        if request.on_cost is not None:
            request.on_cost(self.price_usd)
        return [self.score(request.query, p) for p in request.passages]

    async def aclose(self) -> None:
        return None


class Recorder:
    """A request's `RerankRecorder` in memory: the decisions and the prices, as recorded."""

    def __init__(self) -> None:
        self.traces: list[RerankTrace] = []
        self.spent: list[float] = []

    def record(self, trace: RerankTrace) -> None:
        self.traces.append(trace)

    def spend(self, usd: float) -> None:
        self.spent.append(usd)
