"""The statistics of `querygate eval`: means over questions with 95% percentile bootstrap
intervals, and the document-level ranks retrieval is scored by.

An interval resamples the questions 1,000 times with a fixed seed, so a run is reproducible;
differences between two arms are paired (the per-question differences are resampled).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 20240601  # bench/route_eval.py's
MRR_DEPTH = 10

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A statistic over n questions with its 95% bootstrap interval; None where undefined."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": rounded(self.value),
            "ci95": [rounded(self.low), rounded(self.high)],
            "n": self.n,
        }

    def __str__(self) -> str:
        if self.value is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.value:.3f}"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def bootstrap_interval(
    statistic: Callable[[Rows], float],
    n: int,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """95% percentile interval of `statistic(rows)` over `samples` resamples of rows 0..n-1
    with replacement; None when it is undefined on every resample."""
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n, n)) for _ in range(samples)])
    if np.isnan(values).all():
        return None
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return float(low), float(high)


def estimate(values: F64, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """The mean of per-question `values` (NaN rows excluded) with its bootstrap interval."""
    defined = values[~np.isnan(values)]
    if not len(defined):
        return Estimate(None, None, None, 0)
    interval = bootstrap_interval(lambda rows: float(defined[rows].mean()), len(defined), seed=seed)
    low, high = interval if interval is not None else (None, None)
    return Estimate(float(defined.mean()), low, high, len(defined))


def document_ranks(doc_ids: Sequence[str]) -> dict[str, int]:
    """Each document's 1-based rank: the position of its first (best) chunk among the hits."""
    ranks: dict[str, int] = {}
    for rank, doc in enumerate(doc_ids, start=1):
        ranks.setdefault(doc, rank)
    return ranks


def recall_at(ranks: dict[str, int], relevant: Collection[str], k: int) -> float:
    """Share of the relevant documents ranked within k (one question)."""
    return sum(ranks.get(d, k + 1) <= k for d in relevant) / len(relevant)


def reciprocal_rank(
    ranks: dict[str, int], relevant: Collection[str], depth: int = MRR_DEPTH
) -> float:
    """1 / the best-ranked relevant document's rank, 0 when none is within `depth`."""
    best = min((ranks[d] for d in relevant if d in ranks), default=None)
    return 0.0 if best is None or best > depth else 1.0 / best


def bootstrap_settings() -> dict[str, Any]:
    """How the intervals of a report were drawn, for the report itself."""
    return {"samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED, "level": 0.95}
