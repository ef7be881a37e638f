"""Is the evidence a lookup found enough to answer from? Cheap signals, no model call.

- coverage: the share of the question's content words found in the best passages. A multi-hop
  question usually names things no single passage holds together, so its coverage is low.
- agreement: whether both arms (BM25 and dense) put the best passage near their top. The fused
  RRF score says it, read against the best possible score: both arms rank the passage first,
  (lexical_weight + dense_weight) / (k + 1); a passage only one arm found scores about half.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends.retrieval.base import RRF_K, Hit
from backends.retrieval.stopwords import STOPWORDS

_WORD = re.compile(r"[\w-]+")
_PASSAGES = 3


@dataclass(frozen=True, slots=True)
class GradeThresholds:
    min_coverage: float = 0.5
    # As a fraction of the best possible fused score (both arms rank the passage first).
    min_agreement: float = 0.5


@dataclass(frozen=True, slots=True)
class EvidenceGrade:
    sufficient: bool
    coverage: float
    agreement: float
    # A short tag from a closed set, safe as a metric label.
    reason: str


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.casefold()) if len(w) > 1 and w not in STOPWORDS}


def best_possible_score(lexical_weight: float, dense_weight: float) -> float:
    return (lexical_weight + dense_weight) / (RRF_K + 1)


def grade(
    query: str, hits: list[Hit], thresholds: GradeThresholds, best_possible: float
) -> EvidenceGrade:
    if not hits:
        return EvidenceGrade(False, 0.0, 0.0, "no_hits")
    wanted = content_words(query)
    found = content_words(" ".join(f"{h.title} {h.section} {h.text}" for h in hits[:_PASSAGES]))
    coverage = len(wanted & found) / len(wanted) if wanted else 1.0
    agreement = hits[0].score / best_possible if best_possible > 0 else 0.0
    if coverage < thresholds.min_coverage:
        return EvidenceGrade(False, coverage, agreement, "low_coverage")
    if agreement < thresholds.min_agreement:
        return EvidenceGrade(False, coverage, agreement, "arms_disagree")
    return EvidenceGrade(True, coverage, agreement, "sufficient")
