"""Is the evidence a lookup found enough to answer from? Cheap, no model call.

Two methods, chosen by `EscalationConfig.method`, behind one entry point, `assess`:
- signals (`grade`): two thresholds.
  - coverage: the share of the question's content words found in the best passages. A multi-hop
    question usually names things no single passage holds together, so its coverage is low.
  - agreement: whether both arms (BM25 and dense) put the best passage near their top. The fused
    RRF score says it, read against the best possible score: both arms rank the passage first,
    (lexical_weight + dense_weight) / (k + 1); a passage only one arm found scores about half.
- learned: `routers.sufficiency`'s logistic regression over the evidence (best cosine, coverage,
  the question's names in the two best passages), the query and the classifier's verdict, against a
  threshold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends.retrieval.base import RRF_K, Hit
from backends.retrieval.stopwords import STOPWORDS
from routers.rules import EscalationConfig
from routers.sufficiency import F64, current_model, sufficiency_features
from routers.types import Classification, GradeReason

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
    reason: GradeReason
    # The learned model's P(insufficient); None for the signals method.
    probability: float | None = None


@dataclass(frozen=True, slots=True)
class Signals:
    content_words: int
    coverage: float
    agreement: float


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.casefold()) if len(w) > 1 and w not in STOPWORDS}


def best_possible_score(lexical_weight: float, dense_weight: float) -> float:
    return (lexical_weight + dense_weight) / (RRF_K + 1)


def signals(query: str, hits: list[Hit], best_possible: float) -> Signals:
    wanted = content_words(query)
    found = content_words(" ".join(f"{h.title} {h.section} {h.text}" for h in hits[:_PASSAGES]))
    coverage = len(wanted & found) / len(wanted) if wanted else 1.0
    agreement = hits[0].score / best_possible if best_possible > 0 else 0.0
    return Signals(len(wanted), coverage, agreement)


def grade(
    query: str, hits: list[Hit], thresholds: GradeThresholds, best_possible: float
) -> EvidenceGrade:
    """The signals method."""
    if not hits:
        return EvidenceGrade(False, 0.0, 0.0, "no_hits")
    s = signals(query, hits, best_possible)
    if s.coverage < thresholds.min_coverage:
        return EvidenceGrade(False, s.coverage, s.agreement, "low_coverage")
    if s.agreement < thresholds.min_agreement:
        return EvidenceGrade(False, s.coverage, s.agreement, "arms_disagree")
    return EvidenceGrade(True, s.coverage, s.agreement, "sufficient")


def learned_features(
    query: str, hits: list[Hit], classification: Classification, best_possible: float
) -> tuple[F64, Signals]:
    """The sufficiency model's input row for non-empty hits, and the signals it includes."""
    s = signals(query, hits, best_possible)
    row = sufficiency_features(
        query,
        hits,
        classification,
        content_word_count=s.content_words,
        coverage=s.coverage,
    )
    return row, s


def assess(
    query: str,
    hits: list[Hit],
    classification: Classification,
    best_possible: float,
    config: EscalationConfig,
) -> EvidenceGrade:
    """Grade the evidence with the method `config` selects. Whether an insufficient grade
    escalates is the caller's `config.enabled`; the grade itself is worth logging either way.
    The learned method needs `routers.sufficiency.use_model(...)` called once at start-up."""
    if config.method == "signals" or not hits:
        thresholds = GradeThresholds(config.min_coverage, config.min_agreement)
        return grade(query, hits, thresholds, best_possible)
    model = current_model()
    row, s = learned_features(query, hits, classification, best_possible)
    probability = model.probability(row)
    limit = model.threshold if config.max_insufficiency is None else config.max_insufficiency
    if probability > limit:
        return EvidenceGrade(False, s.coverage, s.agreement, "learned_insufficient", probability)
    return EvidenceGrade(True, s.coverage, s.agreement, "sufficient", probability)
