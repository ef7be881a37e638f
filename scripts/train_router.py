"""Train the learned router and write `routers/router_model.json`.

    python scripts/train_router.py [--out PATH]

Labels (free, from FanOutQA dev, read as JSON from the installed package without importing it):
- each parent question -> multihop;
- each leaf sub-question (no decomposition of its own) -> lookup, deduplicated by normalised text.
  The few intermediate sub-questions that have their own decomposition are left out: they are
  neither whole multi-hop questions nor single lookups;
- each line of `routers/data/direct_examples.txt` -> direct. FanOutQA has no such class, so these
  are synthetic, hand-written, and far easier to separate than real traffic would be.

Splits: 70/15/15 train/val/test by sha256 of the parent id (of the text, for direct lines), so a
parent and its sub-questions never straddle splits. A sub-question text shared by parents in two
splits goes to the earlier split, so the test part never repeats a training text. The test part is
held out for `bench/route_eval.py`; the FanOutQA *test* file is never read here.

Fit: class-balanced, L2-regularised softmax regression on standardised features, solved with
Newton's method from zero. The L2 strength is chosen on val (balanced accuracy), then the model is
refit on train+val. Nothing is random, so retraining writes the same file byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import Vector  # noqa: E402
from routers.features import FEATURE_NAMES  # noqa: E402
from routers.learned import ARTIFACT_FORMAT, CLASSES, DEFAULT_MODEL_PATH, feature_row  # noqa: E402
from routers.types import Route  # noqa: E402

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

DIRECT_PATH = REPO / "routers" / "data" / "direct_examples.txt"
STYLE_SHIFT_PATH = REPO / "routers" / "data" / "style_shift_eval.jsonl"
TRAIN_COMMAND = "python scripts/train_router.py"
SPLITS = ("train", "val", "test")
L2_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
# The bias gets a token penalty only to pin softmax's free per-class shift: a unique optimum.
BIAS_L2 = 1e-6
NEWTON_MAX_STEPS = 50
NEWTON_TOLERANCE = 1e-9
SIGNIFICANT_DIGITS = 6
TEMPERATURE_RANGE = (0.2, 10.0)
TEMPERATURE_STEPS = 801
ECE_BINS = 10


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    route: Route
    group: str  # the FanOutQA parent id, "direct", or "gen:<generator>:<n>" (generated)
    split: str
    generator: str = ""  # scripts/generate_router_data.py's generator; "" when not generated


def fanoutqa_path(name: str) -> Path:
    """A data file of the installed `fanoutqa` package; find_spec locates it without importing
    it (its import pulls spaCy and more)."""
    spec = importlib.util.find_spec("fanoutqa")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("fanoutqa is not installed: pip install --no-deps fanoutqa")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def split_of(key: str) -> str:
    bucket = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 100
    return "train" if bucket < 70 else "val" if bucket < 85 else "test"


def _normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def _leaf_questions(node: dict[str, Any]) -> Iterator[tuple[str, bool]]:
    """(question, is_leaf) for every sub-question below `node`, depth first."""
    for sub in node["decomposition"]:
        yield sub["question"], not sub["decomposition"]
        yield from _leaf_questions(sub)


def fanoutqa_examples(dev: Sequence[dict[str, Any]]) -> tuple[list[Example], int]:
    """Parents as multihop, deduplicated leaves as lookup; and how many intermediates were left
    out."""
    parents: list[Example] = []
    leaves: dict[str, Example] = {}
    intermediates = 0
    for parent in sorted(dev, key=lambda p: str(p["id"])):
        split = split_of(parent["id"])
        parents.append(Example(parent["question"].strip(), Route.MULTIHOP, parent["id"], split))
        for question, is_leaf in _leaf_questions(parent):
            if not is_leaf:
                intermediates += 1
                continue
            key = _normalised(question)
            seen = leaves.get(key)
            if seen is None or SPLITS.index(split) < SPLITS.index(seen.split):
                leaves[key] = Example(question.strip(), Route.LOOKUP, parent["id"], split)
    parent_texts = {_normalised(p.text) for p in parents}
    lookups = [e for key, e in leaves.items() if key not in parent_texts]
    return parents + lookups, intermediates


def direct_examples(path: Path) -> list[Example]:
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    unique = dict.fromkeys(line for line in lines if line and not line.startswith("#"))
    return [
        Example(t, Route.DIRECT, "direct", split_of(f"direct:{_normalised(t)}")) for t in unique
    ]


def load_examples(dev_path: Path | None = None, direct_path: Path = DIRECT_PATH) -> list[Example]:
    """Every labelled example with its split, in a fixed order (split, class, text)."""
    dev = json.loads((dev_path or fanoutqa_path("fanout-final-dev.json")).read_text("utf-8"))
    examples = fanoutqa_examples(dev)[0] + direct_examples(direct_path)
    return sorted(examples, key=lambda e: (SPLITS.index(e.split), CLASSES.index(e.route), e.text))


def style_shift_examples(path: Path = STYLE_SHIFT_PATH) -> list[Example]:
    """The style-shifted evaluation set of `scripts/generate_router_data.py` (other templates
    and other entities than its training file): all held out, split "style"."""
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    return [
        Example(r["text"], Route(r["route"]), r["group"], "style", r["generator"]) for r in rows
    ]


def labels_of(examples: Sequence[Example]) -> I64:
    return np.array([CLASSES.index(e.route) for e in examples], dtype=np.int64)


def feature_matrix(examples: Sequence[Example], vectors: Vector) -> F64:
    return np.stack([feature_row(e.text, v) for e, v in zip(examples, vectors, strict=True)])


def _softmax(logits: F64) -> F64:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=1, keepdims=True), dtype=np.float64)


def _weighted_loss(w: F64, x: F64, y: I64, sample_w: F64, penalty: F64) -> float:
    logits = x @ w.T
    top = logits.max(axis=1)
    log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    nll = -(sample_w * (logits[np.arange(len(y)), y] - log_norm)).sum()
    return float(nll + 0.5 * (penalty * w * w).sum())


def _newton_step(w: F64, x: F64, onehot: F64, sample_w: F64, penalty: F64) -> F64:
    k, d = w.shape
    probs = _softmax(x @ w.T)
    grad = ((probs - onehot) * sample_w[:, None]).T @ x + penalty * w
    hessian = np.zeros((k, d, k, d))
    for a in range(k):
        for b in range(a, k):
            curvature = sample_w * probs[:, a] * (float(a == b) - probs[:, b])
            block = (x * curvature[:, None]).T @ x
            hessian[a, :, b, :] = block
            hessian[b, :, a, :] = block.T
        hessian[a, :, a, :] += np.diag(penalty[a])
    step = np.linalg.solve(hessian.reshape(k * d, k * d), grad.reshape(-1))
    return np.asarray(step.reshape(k, d), dtype=np.float64)


def fit_softmax(x: F64, y: I64, l2: float) -> F64:
    """Class-balanced L2 softmax regression; the last column of `x` is the bias. Newton's method
    with step halving: a dozen exact steps instead of thousands of tuned gradient steps."""
    k, (n, d) = len(CLASSES), x.shape
    counts = np.bincount(y, minlength=k)
    sample_w = (n / (k * np.maximum(counts, 1)))[y]
    sample_w /= sample_w.sum()
    onehot = np.eye(k)[y]
    penalty = np.full((k, d), l2)
    penalty[:, -1] = BIAS_L2
    w = np.zeros((k, d))
    for _ in range(NEWTON_MAX_STEPS):
        step = _newton_step(w, x, onehot, sample_w, penalty)
        current, scale = _weighted_loss(w, x, y, sample_w, penalty), 1.0
        while _weighted_loss(w - scale * step, x, y, sample_w, penalty) > current and scale > 1e-6:
            scale /= 2
        w = w - scale * step
        if np.abs(scale * step).max() < NEWTON_TOLERANCE:
            break
    return w


def fit_router(x: F64, y: I64, l2: float) -> F64:
    """Standardise (so one L2 strength suits embedding and lexical columns alike), fit, and fold
    the standardisation back into raw-space weights that `LearnedClassifier` applies directly."""
    mean = x[:, :-1].mean(axis=0)
    scale = x[:, :-1].std(axis=0)
    scale[scale < 1e-6] = 1.0  # a feature that never fires in training: leave it unscaled
    z = np.column_stack([(x[:, :-1] - mean) / scale, x[:, -1]])
    w = fit_softmax(z, y, l2)
    raw = w[:, :-1] / scale
    bias = w[:, -1] - raw @ mean
    return np.column_stack([raw, bias])


def softmax_probabilities(weights: F64, x: F64) -> F64:
    return _softmax(x @ weights.T)


def fit_temperature(logits: F64, y: I64) -> float:
    """The temperature T minimising the NLL of softmax(logits / T) on held-out rows, over
    TEMPERATURE_STEPS log-spaced values in TEMPERATURE_RANGE: deterministic, and the NLL is
    unimodal in T. Dividing the weights by T applies it; the argmax (the route) is unchanged."""
    low, high = np.log(TEMPERATURE_RANGE[0]), np.log(TEMPERATURE_RANGE[1])
    rows = np.arange(len(y))

    def nll(t: float) -> float:
        return float(-np.log(np.maximum(_softmax(logits / t)[rows, y], 1e-300)).mean())

    return float(f"{min(np.exp(np.linspace(low, high, TEMPERATURE_STEPS)), key=nll):.4g}")


def expected_calibration_error(probs: F64, y: I64, bins: int = ECE_BINS) -> float:
    """Top-label ECE: |accuracy - mean confidence| per equal-width confidence bin, weighted by
    the bin's share of the rows."""
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == y).astype(np.float64)
    bin_of = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    total = 0.0
    for b in range(bins):
        rows = bin_of == b
        if rows.any():
            total += float(rows.mean()) * abs(correct[rows].mean() - confidence[rows].mean())
    return total


def predict(weights: F64, x: F64) -> I64:
    return np.asarray((x @ weights.T).argmax(axis=1), dtype=np.int64)


def confusion(y_true: I64, y_pred: I64) -> I64:
    """Rows are true classes, columns predicted, both in CLASSES order."""
    k = len(CLASSES)
    return np.bincount(y_true * k + y_pred, minlength=k * k).reshape(k, k).astype(np.int64)


def metrics(y_true: I64, y_pred: I64) -> dict[str, Any]:
    matrix = confusion(y_true, y_pred)
    support = matrix.sum(axis=1)
    predicted = matrix.sum(axis=0)
    recall = np.diag(matrix) / np.maximum(support, 1)
    precision = np.diag(matrix) / np.maximum(predicted, 1)
    return {
        "accuracy": float(np.diag(matrix).sum() / max(len(y_true), 1)),
        "balanced_accuracy": float(recall[support > 0].mean()),
        "precision": {str(c): float(p) for c, p in zip(CLASSES, precision, strict=True)},
        "recall": {str(c): float(r) for c, r in zip(CLASSES, recall, strict=True)},
        "confusion": matrix.tolist(),
    }


def _rounded(value: Any) -> Any:
    """Round every float to SIGNIFICANT_DIGITS: a small artifact, and float noise in the last
    bits of a BLAS sum cannot change the file."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _counts(examples: Sequence[Example]) -> dict[str, dict[str, int]]:
    return {
        s: {str(c): sum(1 for e in examples if e.split == s and e.route is c) for c in CLASSES}
        for s in SPLITS
    }


def train(examples: Sequence[Example], vectors: Vector, model_id: str) -> dict[str, Any]:
    """Select L2 on val, refit on train+val, and return the artifact."""
    artifact: dict[str, Any]
    x, y = feature_matrix(examples, vectors), labels_of(examples)
    split = np.array([e.split for e in examples])
    train_rows, val_rows = split == "train", split == "val"
    by_l2 = {
        l2: metrics(y[val_rows], predict(fit_router(x[train_rows], y[train_rows], l2), x[val_rows]))
        for l2 in L2_GRID
    }
    # Best balanced accuracy; on a tie the stronger penalty (the simpler model) wins.
    best_l2 = max(L2_GRID, key=lambda l2: (round(by_l2[l2]["balanced_accuracy"], 9), l2))
    fit_rows = train_rows | val_rows
    weights = fit_router(x[fit_rows], y[fit_rows], best_l2)
    dev_path, fitted = (
        fanoutqa_path("fanout-final-dev.json"),
        [e for e, r in zip(examples, fit_rows, strict=True) if r],
    )
    artifact = _rounded(
        {
            "format": ARTIFACT_FORMAT,
            "classes": [str(c) for c in CLASSES],
            "feature_names": list(FEATURE_NAMES),
            "embedding_model_id": model_id,
            "embedding_dimension": int(vectors.shape[1]),
            "columns": "embedding[0..dim) ‖ feature_names ‖ bias",
            "training": {
                "command": TRAIN_COMMAND,
                "data_sha256": {
                    "fanoutqa/data/fanout-final-dev.json": _sha256(dev_path.read_bytes()),
                    "routers/data/direct_examples.txt": _sha256(DIRECT_PATH.read_bytes()),
                    "fitted_examples": _sha256(
                        "\n".join(f"{e.route}\t{e.text}" for e in fitted).encode("utf-8")
                    ),
                },
                "fanoutqa_version": importlib.metadata.version("fanoutqa"),
                "examples": _counts(examples),
                "intermediate_subquestions_excluded": fanoutqa_examples(
                    json.loads(dev_path.read_text("utf-8"))
                )[1],
                "split": "sha256(parent id | direct text) % 100: <70 train, <85 val, else test",
                "fitted_on": "train+val",
                "l2_grid": list(L2_GRID),
                "l2": best_l2,
                "notes": [
                    "direct class is synthetic: the hand-written routers/data/direct_examples.txt",
                    "lookup/multihop labels: FanOutQA dev leaf sub-questions / parent questions",
                    "FanOutQA test file never used; the dev test split is held out for route_eval",
                    "deterministic: hash splits, zero init, Newton's method; no random seed needed",
                ],
            },
            "metrics": {
                "val_by_l2": {f"{l2:g}": by_l2[l2]["balanced_accuracy"] for l2 in L2_GRID},
                "val_at_chosen_l2": by_l2[best_l2],
            },
            "weights": weights.tolist(),
        }
    )
    return artifact


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_PATH)
    args = parser.parse_args(argv)
    examples = load_examples()
    embedder = MiniLMEmbedder()
    vectors = embedder.embed_sync([e.text for e in examples])
    artifact = train(examples, vectors, embedder.model_id)
    args.out.write_text(json.dumps(artifact, indent=1, ensure_ascii=False) + "\n", "utf-8")
    chosen = artifact["metrics"]["val_at_chosen_l2"]
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes); l2={artifact['training']['l2']}")
    print(f"val accuracy {chosen['accuracy']:.3f}, balanced {chosen['balanced_accuracy']:.3f}")


if __name__ == "__main__":
    main()
