"""The classifier seam and the heuristic classifier (`classifier: heuristic`, and the
learned one's fallback without an embedding).

A classifier reads the query text and its embedding (already computed once per request) and
says direct | lookup | multihop with a confidence and the reasons that drove it. It must be
cheap: it runs on every request that misses the cache.
"""

from __future__ import annotations

from typing import Protocol

from backends.retrieval.base import Vector
from routers.features import lexical_features
from routers.types import Classification, Route


class Classifier(Protocol):
    name: str

    def classify(self, text: str, vector: Vector | None) -> Classification: ...


# Feature weights toward "needs several hops", set by hand (the learned classifier fits its own).
_MULTIHOP_WEIGHTS = {
    "compare": 1.2,
    "chain": 1.2,
    "quantifiers": 0.8,
    "superlative": 0.5,
    "aggregate": 0.6,
    "commas_and": 0.6,
    "questions": 0.4,
    "entities": 0.5,
}
_MULTIHOP_THRESHOLD = 1.1


class HeuristicClassifier:
    """Rules over lexical features: small talk and meta questions go direct, questions with
    several of the multi-hop signals go multihop, everything else is a lookup."""

    name = "heuristic"

    def classify(self, text: str, vector: Vector | None) -> Classification:
        features = lexical_features(text)
        if features["greeting"] or features["meta"]:
            fired = tuple(f"feature:{n}" for n in ("greeting", "meta") if features[n])
            return Classification(Route.DIRECT, 0.9, fired, {"multihop_score": 0.0})
        contributions = {n: w * features[n] for n, w in _MULTIHOP_WEIGHTS.items() if features[n]}
        score = sum(contributions.values())
        fired = tuple(
            f"feature:{name}" for name, _ in sorted(contributions.items(), key=lambda kv: -kv[1])
        )
        if score >= _MULTIHOP_THRESHOLD:
            confidence = min(0.95, 0.5 + (score - _MULTIHOP_THRESHOLD) / 2)
            return Classification(Route.MULTIHOP, confidence, fired, {"multihop_score": score})
        confidence = min(0.95, 0.5 + (_MULTIHOP_THRESHOLD - score) / 2)
        return Classification(Route.LOOKUP, confidence, fired, {"multihop_score": score})
