"""The learned sufficiency model: P(the evidence a lookup found is not enough: multi-hop needed).

Logistic regression over cheap features of what the lookup already has: the best cosine and how
much of the question the best passages hold (scale-free: nothing whose range depends on the
corpus), the query's words (length capped), and the classifier's verdict. No extra model call and
no extra embedding; one dot product of SUFFICIENCY_FEATURES. The weights, the standardisation and
the threshold tuned on held-out questions live in a small JSON artifact written by
`scripts/train_sufficiency.py`.

The dense scores are cosines of one embedding model and the classifier features come from the
learned router, so an artifact trained for another embedding model or on other features would
give confident nonsense: loading refuses it.
"""

from __future__ import annotations

import json
import math
import re
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

# Only features whose range does not depend on the corpus: a model fitted on Wikipedia leads must
# read a tenant's handful of documents the same way. Absolute BM25 scores grow with corpus
# statistics, and "distinct documents" / "both arms' share" of the hits depend on how the corpus
# is chunked and whether it holds k chunks at all (the 3-chunk tests/data/acme corpus is such a
# case). The query's length is capped, see CONTENT_WORDS_CAP.
SUFFICIENCY_FEATURES: tuple[str, ...] = (
    # the evidence
    "dense_top",  # best cosine among the hits (one embedding model's scale, checked at load)
    "coverage",  # share of the question's content words found in the best passages
    "names_in_top2",  # most of the question's names and numbers one of the top 2 passages holds
    # the query
    "content_words",  # log(1 + number of content words, capped)
    "entities",
    "back_references",  # their, them, each...: the question asks about what it names itself
    # the classifier
    "clf_multihop",
)
# The features are the set that flags the fewest answerable single-hop questions at multihop
# recall 0.95, chosen out of fold on train+val (`bench/sufficiency_ablation.py`; the figures, and
# what was tried and not kept, are in docs/benchmarks.md's "The router, measured"). A tenant's
# titles are file names, so a hit's title words are not a feature.
# FanOutQA's parents are long and its sub-questions short (length alone separates them), so past
# a short question's length, more words must not read as "multi-hop".
CONTENT_WORDS_CAP = 6
# Names (a capitalised word not opening a sentence, as routers.features counts entities) and
# numbers: what a passage answering the question names too. Padding a question with chat adds
# none, unlike plain coverage.
_NAME_OR_NUMBER = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][\w'-]+|\b\d[\w'-]*")
_TOKEN = re.compile(r"[\w'-]+")
_POSSESSIVE = re.compile(r"(?:'s|')$")
_NAME_PASSAGES = 2
_BACK_REFERENCE = re.compile(r"\b(their|them|they|each|these|those|its)\b", re.IGNORECASE)


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


def _word(token: str) -> str:
    """A token as names are compared: case-folded, without a possessive ("Obama's" is Obama)."""
    return _POSSESSIVE.sub("", token.casefold())


def _names_in(query: str, hits: list[Hit]) -> float:
    """The largest share of the query's names and numbers that one of the best passages holds
    (one passage: a multi-hop question's names are spread over several); 1 when it has none."""
    wanted = {_word(w) for w in _NAME_OR_NUMBER.findall(query)} - {""}
    if not wanted:
        return 1.0
    return max(_share(wanted, passage) for passage in hits[:_NAME_PASSAGES])


def _share(wanted: set[str], passage: Hit) -> float:
    text = f"{passage.title} {passage.section} {passage.text}"
    return len(wanted & {_word(w) for w in _TOKEN.findall(text)}) / len(wanted)


def _clf_multihop(classification: Classification) -> float:
    # The learned router gives every class's probability; a classifier without scores (the
    # heuristic) gives only its verdict, read as its confidence on the chosen route.
    chosen = classification.confidence if classification.route is Route.MULTIHOP else 0.0
    return classification.scores.get(str(Route.MULTIHOP), chosen)


def sufficiency_features(
    query: str,
    hits: list[Hit],
    classification: Classification,
    *,
    content_word_count: int,
    coverage: float,
) -> F64:
    """The model's input row, in SUFFICIENCY_FEATURES order, for a non-empty list of hits.
    The content words and coverage come from `routers.grading`, which computes them anyway."""
    back_references = len(_BACK_REFERENCE.findall(query))
    values = {
        "dense_top": max((h.dense_score for h in hits if h.dense_score is not None), default=0.0),
        "coverage": coverage,
        "names_in_top2": _names_in(query, hits),
        "content_words": math.log1p(min(content_word_count, CONTENT_WORDS_CAP)),
        "entities": lexical_features(query)["entities"],
        "back_references": back_references / (back_references + 0.5),
        "clf_multihop": _clf_multihop(classification),
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
