"""The learned sufficiency model: P(the evidence a lookup found is not enough: multi-hop needed).

Logistic regression over cheap features of what the lookup already has: both retrieval arms'
scores and ranks (scale-free: nothing whose range depends on the corpus), the query's words
(length capped), and the classifier's verdict. No extra model call and no
extra embedding; one dot product of SUFFICIENCY_FEATURES. The weights, the standardisation and
the threshold tuned on held-out questions live in a small JSON artifact written by
`scripts/train_sufficiency.py`.

The dense scores are cosines of one embedding model and the classifier features come from the
learned router, so an artifact trained for another embedding model or on other features would
give confident nonsense: loading refuses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.retrieval.base import Hit
from routers.features import lexical_features
from routers.types import Classification, Route

F64 = npt.NDArray[np.float64]

DEFAULT_MODEL_PATH = Path(__file__).with_name("sufficiency_model.json")
ARTIFACT_FORMAT = "querygate.sufficiency.logreg/1"

# Only features whose range does not depend on the corpus: a model fitted on 10,033 Wikipedia
# leads must read a tenant's handful of documents the same way. Absolute BM25 scores grow with
# corpus statistics, and "distinct documents" / "both arms' share" of the hits depend on how the
# corpus is chunked and whether it holds k chunks at all (on the 3-chunk tests/data/acme corpus
# distinct_docs alone added +5 logits). The query's length is capped, see CONTENT_WORDS_CAP.
SUFFICIENCY_FEATURES: tuple[str, ...] = (
    # both arms
    "dense_top",  # best cosine among the hits (one embedding model's scale, checked at load)
    "dense_gap",  # best minus second-best cosine: one passage stands out
    "bm25_lead",  # 1 - second-best / best BM25 score: the same, scale-free
    "agreement",  # the best hit's fused score over the best possible (both arms rank it first)
    "tops_agree",  # both arms' best hit (among the hits) is the same passage
    # the query
    "content_words",  # log(1 + number of content words, capped)
    "coverage",  # share of them found in the best passages
    "entities",
    "wh_words",
    # the classifier
    "clf_multihop",
    "clf_confidence",
)
# Tried and not kept (2026-11-30): "a top-3 hit's title words are in the question" and "share of
# the question's words in the best passage" raised the out-of-fold AUC 0.964 -> 0.974 and cut
# the answerable single-hop questions flagged at recall 0.95 from 6.5% to 5.2% on train+val, but
# escalated 2 of tests/data/acme's 10 single-hop questions (a tenant's titles are file names,
# not the subject a Wikipedia title is).
# FanOutQA's parents are long and its sub-questions short (length alone separates them, AUC
# 0.995), so past a short question's length, more words must not read as "multi-hop".
CONTENT_WORDS_CAP = 6


class SufficiencyModelMismatch(ValueError):
    """The artifact does not fit this code or this embedding model; retrain it."""


class SufficiencyModelNotLoaded(RuntimeError):
    """`assess` was asked for the learned method before the model was loaded at start-up."""


@dataclass(frozen=True, slots=True)
class SufficiencyModel:
    """Validated weights over standardised features: p = sigmoid(w . (x - mean) / scale + b)."""

    embedding_model_id: str
    mean: F64
    scale: F64
    weights: F64
    bias: float
    # Escalate when the probability exceeds it (tuned on val by the trainer).
    threshold: float
    training: dict[str, Any]

    def probability(self, row: F64) -> float:
        z = float(self.weights @ ((row - self.mean) / self.scale)) + self.bias
        return _sigmoid(z)


def _sigmoid(z: float) -> float:
    # Split by sign so exp() never overflows.
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _top_two_gap(values: list[float]) -> float:
    ordered = sorted(values, reverse=True)
    return ordered[0] - ordered[1] if len(ordered) > 1 else 0.0


def _relative_lead(values: list[float]) -> float:
    """How far the best score leads the second, as a share of the best: a ratio, so the scale
    of BM25 scores (which grows with the corpus) cancels. A lone score leads fully."""
    ordered = sorted(values, reverse=True)
    if not ordered or ordered[0] <= 0:
        return 0.0
    return 1.0 - ordered[1] / ordered[0] if len(ordered) > 1 else 1.0


def _arm_features(hits: list[Hit]) -> dict[str, float]:
    bm25 = [h.bm25_score for h in hits if h.bm25_score is not None]
    dense = [h.dense_score for h in hits if h.dense_score is not None]
    bm25_first = min(
        ((h.bm25_rank, h.chunk_id) for h in hits if h.bm25_rank is not None), default=None
    )
    dense_first = min(
        ((h.dense_rank, h.chunk_id) for h in hits if h.dense_rank is not None), default=None
    )
    return {
        "dense_top": max(dense, default=0.0),
        "dense_gap": _top_two_gap(dense),
        "bm25_lead": _relative_lead(bm25),
        "tops_agree": float(
            bm25_first is not None and dense_first is not None and bm25_first[1] == dense_first[1]
        ),
    }


def _classifier_features(classification: Classification) -> dict[str, float]:
    # The learned router gives every class's probability; a classifier without scores (the
    # heuristic) gives only its verdict, read as its confidence on the chosen route.
    chosen = classification.confidence if classification.route is Route.MULTIHOP else 0.0
    return {
        "clf_multihop": classification.scores.get(str(Route.MULTIHOP), chosen),
        "clf_confidence": classification.confidence,
    }


_QUERY_LEXICAL = ("entities", "wh_words")


def sufficiency_features(
    query: str,
    hits: list[Hit],
    classification: Classification,
    *,
    content_word_count: int,
    coverage: float,
    agreement: float,
) -> F64:
    """The model's input row, in SUFFICIENCY_FEATURES order, for a non-empty list of hits.
    Coverage and agreement come from `routers.grading`, which computes them anyway."""
    lexical = lexical_features(query)
    values = {
        **_arm_features(hits),
        "agreement": agreement,
        "content_words": math.log1p(min(content_word_count, CONTENT_WORDS_CAP)),
        "coverage": coverage,
        **{name: lexical[name] for name in _QUERY_LEXICAL},
        **_classifier_features(classification),
    }
    return np.array([values[name] for name in SUFFICIENCY_FEATURES], dtype=np.float64)


def load_sufficiency_model(
    path: Path = DEFAULT_MODEL_PATH, *, embedding_model_id: str
) -> SufficiencyModel:
    """Read and check an artifact; raise SufficiencyModelMismatch naming what does not match."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    _expect(raw.get("format"), ARTIFACT_FORMAT, "artifact format", path)
    _expect(raw.get("feature_names"), list(SUFFICIENCY_FEATURES), "feature names", path)
    _expect(raw.get("embedding_model_id"), embedding_model_id, "embedding model id", path)
    arrays = {n: np.asarray(raw[n], dtype=np.float64) for n in ("mean", "scale", "weights")}
    for name, array in arrays.items():
        _expect(array.shape, (len(SUFFICIENCY_FEATURES),), f"{name} shape", path)
    return SufficiencyModel(
        embedding_model_id,
        arrays["mean"],
        arrays["scale"],
        arrays["weights"],
        float(raw["bias"]),
        float(raw["threshold"]),
        dict(raw.get("training", {})),
    )


def _expect(found: object, wanted: object, what: str, path: Path) -> None:
    if found != wanted:
        raise SufficiencyModelMismatch(
            f"sufficiency model {path}: {what} is {found!r}, this code needs {wanted!r}; "
            "retrain with `python scripts/train_sufficiency.py`"
        )


_loaded: dict[tuple[str, Path], SufficiencyModel] = {}
_current: SufficiencyModel | None = None


def use_model(embedding_model_id: str, path: Path = DEFAULT_MODEL_PATH) -> SufficiencyModel:
    """Load and check the model once, at start-up (a mismatch fails there, not on a request),
    and make it the one `current_model` returns. Calling it again (a reload) reuses the load."""
    global _current
    key = (embedding_model_id, path)
    if key not in _loaded:
        _loaded[key] = load_sufficiency_model(path, embedding_model_id=embedding_model_id)
    _current = _loaded[key]
    return _current


def current_model() -> SufficiencyModel:
    if _current is None:
        raise SufficiencyModelNotLoaded(
            "the learned sufficiency model is not loaded: call "
            "routers.sufficiency.use_model(embedder.model_id) at start-up"
        )
    return _current
