"""The learned classifier: multinomial logistic regression over the query embedding and the
lexical features.

Input row = [embedding (384) ‖ lexical features (FEATURE_NAMES order) ‖ 1]; one weight row per
class; the softmax of the three scores gives every class's probability. The weights live in a
small JSON artifact written by `scripts/train_router.py`, in raw feature space (the trainer folds
its standardisation and its calibration temperature into them), so inference is one small
matrix-vector product and the probabilities are the calibrated ones.

The route: multihop when the multihop score leads the better of the other two by more than the
artifact's `multihop_margin` (the operating point chosen with the escalation grade; 0 would be
the argmax), else the better of direct and lookup.

An artifact trained on other features or another embedding model would give confident nonsense,
so loading refuses it instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.retrieval.base import Vector
from routers.classifier import Classifier, HeuristicClassifier
from routers.features import FEATURE_NAMES, lexical_features
from routers.types import Classification, Route

F64 = npt.NDArray[np.float64]

DEFAULT_MODEL_PATH = Path(__file__).with_name("router_model.json")
ARTIFACT_FORMAT = "querygate.router.logreg/2"
CLASSES: tuple[Route, ...] = (Route.DIRECT, Route.LOOKUP, Route.MULTIHOP)
_TOP_FEATURES = 3


class RouterModelMismatch(ValueError):
    """The artifact does not fit this code or this embedding model; retrain it."""


@dataclass(frozen=True, slots=True)
class RouterModel:
    """Validated weights: `weights[k]` scores class `CLASSES[k]` against `feature_row(...)`."""

    embedding_model_id: str
    embedding_dimension: int
    weights: F64  # (len(CLASSES), embedding_dimension + len(FEATURE_NAMES) + 1)
    training: dict[str, Any]
    # Multihop when its logit leads the better other class by more than this (see route_index).
    multihop_margin: float = 0.0


_MULTIHOP = CLASSES.index(Route.MULTIHOP)


def route_index(logits: F64, multihop_margin: float) -> int:
    """The chosen class for one row of logits: multihop when it leads the better of the other
    two by more than `multihop_margin`, else the better of those two (ties to the first)."""
    others = [k for k in range(len(CLASSES)) if k != _MULTIHOP]
    best_other = max(others, key=lambda k: (float(logits[k]), -k))
    if float(logits[_MULTIHOP]) - float(logits[best_other]) > multihop_margin:
        return _MULTIHOP
    return best_other


def feature_row(text: str, vector: Vector) -> F64:
    """The model's input for one query, as the trainer builds it. `classify` computes the same
    product in three slices (embedding, lexical, bias) to skip the concatenation."""
    lexical = lexical_features(text)
    return np.concatenate(
        [
            np.asarray(vector, dtype=np.float64).reshape(-1),
            [lexical[n] for n in FEATURE_NAMES],
            [1.0],
        ]
    )


def load_router_model(path: Path, *, embedding_model_id: str) -> RouterModel:
    """Read and check an artifact; raise RouterModelMismatch naming what does not match."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    _expect(raw.get("format"), ARTIFACT_FORMAT, "artifact format", path)
    _expect(raw.get("classes"), [str(c) for c in CLASSES], "classes", path)
    _expect(raw.get("feature_names"), list(FEATURE_NAMES), "lexical feature names", path)
    _expect(raw.get("embedding_model_id"), embedding_model_id, "embedding model id", path)
    dimension = int(raw["embedding_dimension"])
    weights = np.asarray(raw["weights"], dtype=np.float64)
    expected_shape = (len(CLASSES), dimension + len(FEATURE_NAMES) + 1)
    _expect(weights.shape, expected_shape, "weight matrix shape", path)
    margin = float(raw["decision"]["multihop_margin"])
    return RouterModel(
        embedding_model_id, dimension, weights, dict(raw.get("training", {})), margin
    )


def _expect(found: object, wanted: object, what: str, path: Path) -> None:
    if found != wanted:
        raise RouterModelMismatch(
            f"router model {path}: {what} is {found!r}, this code needs {wanted!r}; "
            "retrain with `python scripts/train_router.py`"
        )


class LearnedClassifier:
    """Softmax regression router. Reasons name the chosen class's probability first, then every
    class's probability, then the lexical features that pushed hardest toward the choice."""

    name = "learned"

    def __init__(self, model: RouterModel, fallback: Classifier | None = None) -> None:
        self._model = model
        self._emb_weights = np.ascontiguousarray(model.weights[:, : model.embedding_dimension])
        self._lex_weights = np.ascontiguousarray(model.weights[:, model.embedding_dimension : -1])
        self._bias = np.ascontiguousarray(model.weights[:, -1])
        # Without an embedding (embedder down) the model cannot score; the heuristic still can.
        self._fallback = fallback or HeuristicClassifier()

    @classmethod
    def load(cls, *, embedding_model_id: str, path: Path = DEFAULT_MODEL_PATH) -> LearnedClassifier:
        return cls(load_router_model(path, embedding_model_id=embedding_model_id))

    @property
    def model(self) -> RouterModel:
        return self._model

    def classify(self, text: str, vector: Vector | None) -> Classification:
        if vector is None:
            fallen = self._fallback.classify(text, None)
            reasons = ("fallback:no_embedding", *fallen.reasons)
            return Classification(fallen.route, fallen.confidence, reasons, fallen.scores)
        embedding = np.asarray(vector).reshape(-1)
        if embedding.shape[0] != self._model.embedding_dimension:
            raise ValueError(
                f"embedding has {embedding.shape[0]} dimensions, "
                f"the router model needs {self._model.embedding_dimension}"
            )
        lexical = lexical_features(text)
        values = np.array([lexical[n] for n in FEATURE_NAMES], dtype=np.float64)
        logits = self._emb_weights @ embedding + self._lex_weights @ values + self._bias
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        best = route_index(logits, self._model.multihop_margin)
        # The most probable class was multihop but not by the margin: say so, or the reasons
        # would show a route that is not the most probable one without a word why.
        held_back = (
            (f"multihop:under_margin_{self._model.multihop_margin:g}",)
            if best != _MULTIHOP and int(probs.argmax()) == _MULTIHOP
            else ()
        )
        return Classification(
            route=CLASSES[best],
            confidence=float(probs[best]),
            reasons=(
                *_probability_reasons(probs, best),
                *held_back,
                *self._top_features(values, best),
            ),
            scores={str(c): float(p) for c, p in zip(CLASSES, probs, strict=True)},
        )

    def _top_features(self, values: F64, best: int) -> tuple[str, ...]:
        # The weights are centred across classes (an L2 fit makes them so), so weight * value is
        # the feature's push toward this class relative to the average class.
        contributions = self._lex_weights[best] * values
        order = np.argsort(-contributions, kind="stable")[:_TOP_FEATURES]
        return tuple(f"feature:{FEATURE_NAMES[i]}" for i in order if contributions[i] > 0)


def _probability_reasons(probs: F64, best: int) -> tuple[str, ...]:
    order = [best, *(k for k in range(len(CLASSES)) if k != best)]
    return tuple(f"{CLASSES[k]}:p={probs[k]:.2f}" for k in order)
