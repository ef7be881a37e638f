"""Stage timings: one clock per request, read into the response and the stage histogram, and
the one place a stage is traced too: each timed stage is a child span of the request's when
tracing records it (`gateway.obs.tracing`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, get_args

from gateway.obs import tracing
from gateway.obs.metrics import Metrics

# The pipeline's stages (the `querygate_stage_duration_seconds` label): a closed set, so the
# histogram's series are known at start (`Metrics.initialise`).
Stage = Literal[
    "rewrite", "cache_lookup", "cache_semantic", "embed", "classify", "policy", "corpus",
    "retrieve", "rerank", "agent", "plan", "generate", "cache_store",
]  # fmt: skip
STAGES: tuple[Stage, ...] = get_args(Stage)


class StageTimer:
    def __init__(self, metrics: Metrics, started: float | None = None) -> None:
        """`started`: a `time.perf_counter()` reading to count from (the request's arrival)."""
        self._metrics = metrics
        self._started = time.perf_counter() if started is None else started
        self.stages_ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: Stage) -> Iterator[None]:
        with tracing.child(name):
            start = time.perf_counter()
            try:
                yield
            finally:
                self._count(name, time.perf_counter() - start)

    def add(self, name: Stage, seconds: float) -> None:
        """Time measured elsewhere (a stage run inside another, such as the rerank inside the
        lookup), counted and traced as `stage` does."""
        self._count(name, seconds)
        tracing.record_past(name, seconds)

    def _count(self, name: Stage, seconds: float) -> None:
        self._metrics.stage_duration.labels(name).observe(seconds)
        self.stages_ms[name] = round(self.stages_ms.get(name, 0.0) + seconds * 1000, 3)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def report(self) -> dict[str, float]:
        return {**self.stages_ms, "total": round(self.elapsed_s() * 1000, 3)}
