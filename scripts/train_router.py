"""Train the learned router and write `routers/router_model.json`.

    python scripts/train_router.py [--out PATH]
    python scripts/train_router.py --check     # retrain in memory, diff against the artifact

Labels (free, from FanOutQA dev, read as JSON from the installed package without importing it):
- each parent question -> multihop;
- each leaf sub-question (no decomposition of its own) -> lookup, deduplicated by normalised text.
  The few intermediate sub-questions that have their own decomposition are left out: they are
  neither whole multi-hop questions nor single lookups;
- each line of `routers/data/direct_examples.txt` -> direct (hand-written);
- each line of `routers/data/generated_train.jsonl` (`scripts/generate_router_data.py`: other
  question shapes, rare-entity and identifier lookups, long direct messages), at GENERATED_WEIGHT
  of a real example's weight: enough to teach the shapes FanOutQA lacks, little enough that
  FanOutQA's real single-hop questions are not pushed to multihop (at weight 1 the router flagged
  11-12% of them).

Splits: 70/15/15 train/val/test by sha256 of the parent id (of the text, for direct lines; of the
generator's group, for generated lines), so a parent and its sub-questions never straddle splits.
A sub-question text shared by parents in two splits goes to the earlier split, so the test part
never repeats a training text. The test part is held out for `bench/route_eval.py` and
`bench/escalation_eval.py`; the FanOutQA *test* file is never read here.

Fit: class-balanced, example-weighted, L2-regularised softmax regression on standardised features,
solved with Newton's method from zero, on TRAIN only. The L2 strength is chosen on val: the AUC
of the multihop margin (below) for real multihop against real single-hop questions. Calibration:
one temperature fitted on val (NLL), folded into the weights, so the probabilities the gateway
reports are the calibrated ones (val ECE before/after in the artifact).

Operating point: the router says multihop when the multihop logit leads the better of the other
two by more than `multihop_margin` (0 would be the argmax). Read from out-of-fold logits of the
tuning part (train+val; FOLDS folds by parent, each router fitted on the other folds, the val
temperature applied), the margin is the largest on a 0.05 grid that still flags
GENERATED_MULTIHOP_RECALL of the generated multihop questions (the shapes FanOutQA lacks). A
larger margin flags fewer real single-hop questions and leaves more FanOutQA multihop questions
to the escalation grade: `scripts/train_sufficiency.py` picks its threshold for this margin and
prints the joint frontier over margins, to check the choice against.

Reproducible: hash splits and folds, zero init, Newton's method, BLAS pinned to one thread, every
float written to SIGNIFICANT_DIGITS significant digits; the same data and command write the same
bytes (`--check` says whether they do here).
"""

from __future__ import annotations

import os

for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    # One BLAS thread: a multi-threaded sum can add in another order and move the last bits.
    os.environ[_threads] = "1"

import argparse  # noqa: E402
import difflib  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import Vector  # noqa: E402
from routers.features import FEATURE_NAMES  # noqa: E402
from routers.learned import (  # noqa: E402
    ARTIFACT_FORMAT,
    CLASSES,
    DEFAULT_MODEL_PATH,
    feature_row,
    route_index,
)
from routers.types import Route  # noqa: E402

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

DIRECT_PATH = REPO / "routers" / "data" / "direct_examples.txt"
STYLE_SHIFT_PATH = REPO / "routers" / "data" / "style_shift_eval.jsonl"
GENERATED_PATH = REPO / "routers" / "data" / "generated_train.jsonl"
TRAIN_COMMAND = "python scripts/train_router.py"
SPLITS = ("train", "val", "test")
L2_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
# A generated example weighs this much of a real one (FanOutQA, hand-written direct lines).
GENERATED_WEIGHT = 0.1
FOLDS = 5
# The router keeps at least this multihop recall on the generated questions of the tuning part
# (out of fold): the shapes FanOutQA lacks, which the escalation grade was not fitted on. A larger
# margin flags fewer real single-hop questions itself but leaves more FanOutQA multihop questions
# to the grade, whose threshold must then drop. Set from the joint frontier on the tuning part
# (scripts/train_sufficiency.py prints it): 0.80 gives a margin (1.2) next to the frontier's
# fewest lookup-in questions flagged at recall 0.95; a lower recall gives a larger margin.
GENERATED_MULTIHOP_RECALL = 0.80
MARGIN_GRID = tuple(round(0.05 * i, 2) for i in range(-40, 121))
# The bias gets a token penalty only to pin softmax's free per-class shift: a unique optimum.
BIAS_L2 = 1e-6
NEWTON_MAX_STEPS = 50
NEWTON_TOLERANCE = 1e-9
# Weights differ in the 6th significant digit between machines; 5 keeps float noise (BLAS
# order, the embedder's last bits) from changing the file while costing nothing in accuracy.
SIGNIFICANT_DIGITS = 5
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
    weight: float = 1.0  # in the fit: GENERATED_WEIGHT for generated examples


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


def generated_examples(path: Path = GENERATED_PATH) -> list[Example]:
    """`scripts/generate_router_data.py`'s training file, split by its group like a parent, at
    GENERATED_WEIGHT; sorted like load_examples."""
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    examples = [
        Example(
            r["text"],
            Route(r["route"]),
            r["group"],
            split_of(r["group"]),
            r["generator"],
            GENERATED_WEIGHT,
        )
        for r in rows
    ]
    return sorted(examples, key=lambda e: (SPLITS.index(e.split), CLASSES.index(e.route), e.text))


def training_examples() -> list[Example]:
    """What the router is fitted, calibrated and tuned on: FanOutQA dev and the direct lines
    (load_examples), then the generated lines; each part in its fixed order."""
    return load_examples() + generated_examples()


def fold_of(example: Example, salt: str = "fold") -> int:
    """The cross-fitting fold, by parent (a direct line or generated group is its own parent);
    another `salt` gives another assignment (bench/sufficiency_ablation.py's)."""
    key = example.group if example.group != "direct" else f"direct:{example.text}"
    return int(hashlib.sha256(f"{salt}:{key}".encode()).hexdigest()[:8], 16) % FOLDS


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


def fit_softmax(x: F64, y: I64, l2: float, weight: F64 | None = None) -> F64:
    """Class-balanced L2 softmax regression; the last column of `x` is the bias; `weight` is each
    row's weight (1 when None), classes balanced by their total weight. Newton's method with step
    halving: a dozen exact steps instead of thousands of tuned gradient steps."""
    k, (n, d) = len(CLASSES), x.shape
    row_w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64)
    totals = np.bincount(y, weights=row_w, minlength=k)
    sample_w = row_w * (row_w.sum() / (k * np.maximum(totals, 1e-12)))[y]
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


def fit_router(x: F64, y: I64, l2: float, weight: F64 | None = None) -> F64:
    """Standardise (so one L2 strength suits embedding and lexical columns alike), fit, and fold
    the standardisation back into raw-space weights that `LearnedClassifier` applies directly."""
    mean = x[:, :-1].mean(axis=0)
    scale = x[:, :-1].std(axis=0)
    scale[scale < 1e-6] = 1.0  # a feature that never fires in training: leave it unscaled
    z = np.column_stack([(x[:, :-1] - mean) / scale, x[:, -1]])
    w = fit_softmax(z, y, l2, weight)
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


def margins(logits: F64) -> F64:
    """How far each row's multihop logit leads the better of the other two (routers.learned)."""
    multihop = CLASSES.index(Route.MULTIHOP)
    others = [k for k in range(len(CLASSES)) if k != multihop]
    return np.asarray(logits[:, multihop] - logits[:, others].max(axis=1), dtype=np.float64)


def route_indices(logits: F64, multihop_margin: float) -> I64:
    """`routers.learned.route_index` for many rows."""
    return np.array([route_index(row, multihop_margin) for row in logits], dtype=np.int64)


def fold_weights(
    x: F64, y: I64, weight: F64, folds: I64, fit_rows: npt.NDArray[np.bool_], l2: float
) -> list[F64]:
    """One router per fold, fitted on `fit_rows` outside that fold: cross-fitted outputs for
    the fold's rows (and for any other row assigned to it, e.g. scripts/train_sufficiency.py's
    padded twins) are out of sample."""
    return [
        fit_router(
            x[fit_rows & (folds != f)],
            y[fit_rows & (folds != f)],
            l2,
            weight[fit_rows & (folds != f)],
        )
        for f in range(FOLDS)
    ]


def choose_margin(multihop_margins: F64, recall: float = GENERATED_MULTIHOP_RECALL) -> float:
    """The largest MARGIN_GRID value at which at least `recall` of these multihop rows are
    still flagged (the smallest grid value if none is)."""
    kept = [m for m in MARGIN_GRID if float((multihop_margins > m).mean()) >= recall]
    return max(kept, default=MARGIN_GRID[0])


def margin_auc(multihop_margins: F64, lookup_margins: F64) -> float:
    """P(a multihop row's margin exceeds a single-hop row's), ties counted half."""
    above = (multihop_margins[:, None] > lookup_margins[None, :]).mean()
    tied = (multihop_margins[:, None] == lookup_margins[None, :]).mean()
    return float(above + 0.5 * tied)


def _rates(pred: I64, y: I64, rows: npt.NDArray[np.bool_]) -> dict[str, float]:
    """Share of each true class's rows (among `rows`) routed multihop."""
    multihop = CLASSES.index(Route.MULTIHOP)
    return {
        f"{c}_flagged_multihop": float((pred[rows & (y == k)] == multihop).mean())
        for k, c in enumerate(CLASSES)
        if (rows & (y == k)).any()
    }


def fit_artifact(examples: Sequence[Example], vectors: Vector, model_id: str) -> dict[str, Any]:
    """The artifact's model and its tuning figures, from labelled examples alone (no file is
    read): L2 on val, fit on train, temperature on val, margin out of fold on train+val."""
    x, y = feature_matrix(examples, vectors), labels_of(examples)
    weight = np.array([e.weight for e in examples], dtype=np.float64)
    split = np.array([e.split for e in examples])
    real = weight == 1.0
    train_rows, val_rows = split == "train", split == "val"
    multihop, lookup = CLASSES.index(Route.MULTIHOP), CLASSES.index(Route.LOOKUP)
    fits = {l2: fit_router(x[train_rows], y[train_rows], l2, weight[train_rows]) for l2 in L2_GRID}
    val_real = val_rows & real
    by_l2 = {l2: metrics(y[val_real], predict(w, x[val_real])) for l2, w in fits.items()}
    # L2 by how well the multihop margin ranks real multihop above real single-hop questions on
    # val (what the operating point trades on); on a tie the stronger penalty wins.
    auc_by_l2 = {
        l2: round(
            margin_auc(
                margins(x[val_real & (y == multihop)] @ w.T),
                margins(x[val_real & (y == lookup)] @ w.T),
            ),
            9,
        )
        for l2, w in fits.items()
    }
    best_l2 = max(L2_GRID, key=lambda l2: (auc_by_l2[l2], l2))
    raw = fits[best_l2]
    temperature = fit_temperature(x[val_rows] @ raw.T, y[val_rows])
    weights = raw / temperature
    # The operating point, out of fold on the tuning part (train+val).
    tune = train_rows | val_rows
    folds = np.array([fold_of(e) for e in examples], dtype=np.int64)
    oof = np.full((len(examples), len(CLASSES)), np.nan)
    for f, w in enumerate(fold_weights(x, y, weight, folds, tune, best_l2)):
        rows = tune & (folds == f)
        oof[rows] = x[rows] @ w.T / temperature
    generated = ~real
    margin = choose_margin(margins(oof[tune & generated & (y == multihop)]))
    artifact: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "classes": [str(c) for c in CLASSES],
        "feature_names": list(FEATURE_NAMES),
        "embedding_model_id": model_id,
        "embedding_dimension": int(vectors.shape[1]),
        "columns": "embedding[0..dim) ‖ feature_names ‖ bias",
        "decision": {"multihop_margin": margin},
        "training": {
            "command": TRAIN_COMMAND,
            "examples": _counts(examples),
            "generated_weight": GENERATED_WEIGHT,
            "split": "sha256(parent id | direct text | generated group) % 100: <70 train, "
            "<85 val, else test",
            "fitted_on": "train",
            "l2_grid": list(L2_GRID),
            "l2": best_l2,
            "temperature": temperature,
            "generated_multihop_recall": GENERATED_MULTIHOP_RECALL,
        },
        "metrics": {
            "val_multihop_margin_auc_by_l2": {f"{l2:g}": auc_by_l2[l2] for l2 in L2_GRID},
            "val_balanced_accuracy_by_l2": {
                f"{l2:g}": by_l2[l2]["balanced_accuracy"] for l2 in L2_GRID
            },
            "val_at_chosen_l2": by_l2[best_l2],
            "val_ece": {
                "before_temperature": expected_calibration_error(
                    softmax_probabilities(raw, x[val_rows]), y[val_rows]
                ),
                "after_temperature": expected_calibration_error(
                    softmax_probabilities(weights, x[val_rows]), y[val_rows]
                ),
            },
            "out_of_fold_tuning": {
                "real": _rates(route_indices(oof[tune], margin), y[tune], real[tune]),
                "real_at_argmax": _rates(route_indices(oof[tune], 0.0), y[tune], real[tune]),
                "generated": _rates(route_indices(oof[tune], margin), y[tune], generated[tune]),
            },
        },
        "weights": weights.tolist(),
    }
    rounded: dict[str, Any] = _rounded(artifact)
    return rounded


def train(examples: Sequence[Example], vectors: Vector, model_id: str) -> dict[str, Any]:
    """fit_artifact, with where the data came from (file digests, versions)."""
    artifact = fit_artifact(examples, vectors, model_id)
    dev_path = fanoutqa_path("fanout-final-dev.json")
    fitted = [e for e in examples if e.split == "train"]
    artifact["training"] = {
        **artifact["training"],
        "data_sha256": {
            "fanoutqa/data/fanout-final-dev.json": _sha256(dev_path.read_bytes()),
            "routers/data/direct_examples.txt": _sha256(DIRECT_PATH.read_bytes()),
            "routers/data/generated_train.jsonl": _sha256(GENERATED_PATH.read_bytes()),
            "fitted_examples": _sha256(
                "\n".join(f"{e.route}\t{e.weight:g}\t{e.text}" for e in fitted).encode("utf-8")
            ),
        },
        "fanoutqa_version": importlib.metadata.version("fanoutqa"),
        "intermediate_subquestions_excluded": fanoutqa_examples(
            json.loads(dev_path.read_text("utf-8"))
        )[1],
        "notes": [
            "direct class: hand-written routers/data/direct_examples.txt + generated direct lines",
            "lookup/multihop labels: FanOutQA dev leaf sub-questions / parent questions, and the "
            "generated lines (scripts/generate_router_data.py) at generated_weight",
            "weights are divided by the temperature fitted on val: probabilities are calibrated",
            "multihop_margin: out of fold on train+val, the largest keeping "
            "generated_multihop_recall of the generated multihop questions",
            "FanOutQA test file never used; the dev test split is held out for the benches",
        ],
    }
    return artifact


def render(artifact: dict[str, Any]) -> bytes:
    """The artifact's bytes on disk: what two runs must agree on."""
    return (json.dumps(artifact, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def check(expected: bytes, produced: bytes, path: Path) -> int:
    """0 when a retrain wrote the same bytes as `path`; else print where they differ, 1."""
    if expected == produced:
        print(f"{path}: retrained artifact is byte-identical ({len(produced)} bytes)")
        return 0
    diff = difflib.unified_diff(
        expected.decode("utf-8").splitlines(),
        produced.decode("utf-8").splitlines(),
        f"{path} (committed)",
        "retrained",
        n=1,
        lineterm="",
    )
    print("\n".join(list(diff)[:40]))
    print(f"{path}: retrained artifact DIFFERS")
    return 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument(
        "--check", action="store_true", help="retrain in memory and diff against --out"
    )
    args = parser.parse_args(argv)
    examples = training_examples()
    embedder = MiniLMEmbedder()
    vectors = embedder.embed_sync([e.text for e in examples])
    artifact = train(examples, vectors, embedder.model_id)
    produced = render(artifact)
    if args.check:
        raise SystemExit(check(args.out.read_bytes(), produced, args.out))
    args.out.write_bytes(produced)
    chosen = artifact["metrics"]["val_at_chosen_l2"]
    print(f"wrote {args.out} ({len(produced)} bytes); l2={artifact['training']['l2']}")
    print(f"val accuracy {chosen['accuracy']:.3f}, balanced {chosen['balanced_accuracy']:.3f}")
    print(json.dumps({k: v for k, v in artifact["metrics"].items() if k != "val_at_chosen_l2"}))
    print(f"decision: {artifact['decision']}, temperature {artifact['training']['temperature']}")


if __name__ == "__main__":
    main()
