"""The learned router: its committed artifact, its decisions on obvious cases, its refusal of a
mismatched artifact, and the determinism of its training."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backends.embeddings.minilm import MiniLMEmbedder
from backends.retrieval.base import Vector
from routers.features import FEATURE_NAMES
from routers.learned import (
    CLASSES,
    DEFAULT_MODEL_PATH,
    LearnedClassifier,
    RouterModelMismatch,
    load_router_model,
    route_index,
)
from routers.types import Route
from scripts.train_router import (
    Example,
    check,
    feature_matrix,
    fit_artifact,
    fit_router,
    labels_of,
    load_examples,
    render,
    training_examples,
)

MODEL_ID = MiniLMEmbedder.model_id


@pytest.fixture(scope="session")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="session")
def classifier(embedder: MiniLMEmbedder) -> LearnedClassifier:
    return LearnedClassifier.load(embedding_model_id=embedder.model_id)


def _vector(embedder: MiniLMEmbedder, text: str) -> Vector:
    return embedder.embed_sync([text])  # one row: classify() takes (1, dim) or (dim,)


def _artifact_with(tmp_path: Path, **changes: object) -> Path:
    raw = json.loads(DEFAULT_MODEL_PATH.read_text(encoding="utf-8"))
    raw.update(changes)
    path = tmp_path / "router_model.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def test_committed_artifact_loads_with_the_current_feature_names(
    classifier: LearnedClassifier,
) -> None:
    raw = json.loads(DEFAULT_MODEL_PATH.read_text(encoding="utf-8"))
    assert raw["feature_names"] == list(FEATURE_NAMES)
    assert classifier.model.weights.shape == (3, 384 + len(FEATURE_NAMES) + 1)


def test_committed_artifact_is_small() -> None:
    assert DEFAULT_MODEL_PATH.stat().st_size < 200_000


@pytest.mark.parametrize(
    ("text", "route"),
    [
        ("hello there, how are you?", Route.DIRECT),
        (
            "Which of the five tallest buildings in the world was completed first, and who were "
            "the architects of each?",
            Route.MULTIHOP,
        ),
        ("When was the Eiffel Tower built?", Route.LOOKUP),
    ],
)
def test_obvious_questions_take_the_obvious_route(
    classifier: LearnedClassifier, embedder: MiniLMEmbedder, text: str, route: Route
) -> None:
    assert classifier.classify(text, _vector(embedder, text)).route is route


def test_reasons_give_every_class_probability_chosen_first(
    classifier: LearnedClassifier, embedder: MiniLMEmbedder
) -> None:
    text = "Compare the populations of the three largest cities in each Nordic country."
    result = classifier.classify(text, _vector(embedder, text))
    probabilities = [r for r in result.reasons if ":p=" in r]
    assert probabilities[0] == f"{result.route}:p={result.confidence:.2f}"
    assert sorted(r.split(":")[0] for r in probabilities) == ["direct", "lookup", "multihop"]
    assert sum(result.scores.values()) == pytest.approx(1.0)


def test_artifact_with_other_feature_names_is_refused(
    embedder: MiniLMEmbedder, tmp_path: Path
) -> None:
    path = _artifact_with(tmp_path, feature_names=[*FEATURE_NAMES[:-1], "renamed"])
    with pytest.raises(RouterModelMismatch, match="feature names"):
        load_router_model(path, embedding_model_id=embedder.model_id)


def test_artifact_for_another_embedding_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RouterModelMismatch, match="embedding model id"):
        load_router_model(DEFAULT_MODEL_PATH, embedding_model_id="text-embedding-3-small")


def test_without_an_embedding_it_falls_back_to_the_heuristic(classifier: LearnedClassifier) -> None:
    result = classifier.classify("hi", None)
    assert result.route is Route.DIRECT
    assert result.reasons[0] == "fallback:no_embedding"


def test_training_twice_on_the_same_data_gives_identical_weights(embedder: MiniLMEmbedder) -> None:
    # Every 15th training example keeps all three classes and the test fast.
    subset = [e for e in load_examples() if e.split == "train"][::15]
    x = feature_matrix(subset, embedder.embed_sync([e.text for e in subset]))
    y = labels_of(subset)
    assert set(y.tolist()) == {0, 1, 2}
    assert np.array_equal(fit_router(x, y, 1e-3), fit_router(x, y, 1e-3))


def test_the_multihop_margin_decides_between_multihop_and_the_better_other_class() -> None:
    logits = np.array([0.0, 1.0, 2.0])  # direct, lookup, multihop: multihop leads lookup by 1
    assert CLASSES[route_index(logits, 0.0)] is Route.MULTIHOP
    assert CLASSES[route_index(logits, 0.99)] is Route.MULTIHOP
    assert CLASSES[route_index(logits, 1.0)] is Route.LOOKUP
    assert CLASSES[route_index(np.array([1.5, 1.0, 2.0]), 1.0)] is Route.DIRECT


def test_the_committed_artifact_carries_its_calibration_and_operating_point() -> None:
    raw = json.loads(DEFAULT_MODEL_PATH.read_text(encoding="utf-8"))
    assert raw["training"]["fitted_on"] == "train"
    assert raw["training"]["temperature"] > 0
    ece = raw["metrics"]["val_ece"]
    assert ece["after_temperature"] <= ece["before_temperature"]
    margin = raw["decision"]["multihop_margin"]
    assert load_router_model(DEFAULT_MODEL_PATH, embedding_model_id=MODEL_ID).multihop_margin == (
        margin
    )


def _small_training_set() -> tuple[list[Example], np.ndarray]:
    """Every 20th real and generated example (all classes, train/val, several folds) with
    fixed pseudo-random 16-dimensional vectors: the whole fit runs in about a second."""
    examples = [e for e in training_examples() if e.split != "test"][::20]
    vectors = np.random.default_rng(7).normal(size=(len(examples), 16)).astype(np.float32)
    return examples, vectors


def test_training_twice_on_a_small_fixed_set_writes_the_same_bytes() -> None:
    examples, vectors = _small_training_set()
    assert {e.route for e in examples} == set(CLASSES)
    assert any(e.weight != 1.0 for e in examples) and {e.split for e in examples} == {
        "train",
        "val",
    }
    first = render(fit_artifact(examples, vectors, "fixed"))
    second = render(fit_artifact(list(examples), vectors.copy(), "fixed"))
    assert first == second
    # Rounding to SIGNIFICANT_DIGITS absorbs noise far below it (another BLAS's summation
    # order, the embedder's last bits): a 1e-7 relative nudge of every input changes no byte.
    nudged = (vectors * (1 + 1e-7)).astype(np.float32)
    assert render(fit_artifact(examples, nudged, "fixed")) == first


def test_a_multihop_verdict_held_back_by_the_margin_says_so(embedder: MiniLMEmbedder) -> None:
    model = load_router_model(DEFAULT_MODEL_PATH, embedding_model_id=MODEL_ID)
    text = "Which of the five tallest buildings in the world was completed first?"
    vector = _vector(embedder, text)
    argmax = LearnedClassifier(replace(model, multihop_margin=0.0)).classify(text, vector)
    assert argmax.route is Route.MULTIHOP
    margin = np.log(
        argmax.scores["multihop"] / max(argmax.scores["direct"], argmax.scores["lookup"])
    )
    held = LearnedClassifier(replace(model, multihop_margin=float(margin) + 0.5)).classify(
        text, vector
    )
    assert held.route is not Route.MULTIHOP
    assert held.scores == argmax.scores
    assert f"multihop:under_margin_{margin + 0.5:g}" in held.reasons


def test_check_passes_identical_bytes_and_fails_on_a_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "artifact.json"
    assert check(b'{"a": 1}\n', b'{"a": 1}\n', path) == 0
    assert check(b'{"a": 1}\n', b'{"a": 2}\n', path) == 1
    assert '+{"a": 2}' in capsys.readouterr().out
