"""Train the learned sufficiency model and write `routers/sufficiency_model.json`.

    python scripts/train_sufficiency.py [--out PATH]

Data: the split of `scripts/train_router.py` (FanOutQA dev, by parent; the FanOutQA test file is
never read). Each question runs the lookup path's real retrieval over the 10,033 Wikipedia lead
sections in the embedded index (`bench/escalation_eval.py`'s `run_lookup`; the index and the
embeddings are built and cached by `bench/retrieval_eval.py`'s helpers on the first run).
Labels: parent questions = insufficient (1); leaf sub-questions whose evidence page is in the
corpus ("lookup-in") = sufficient (0). Sub-questions whose page the corpus lacks are left out:
their evidence is thin for a reason no feature of the question can know.

Long single-hop questions, generated: FanOutQA's parents are long and its sub-questions short, so
length alone separates the labels (AUC 0.995) and a model fitted on them escalates any long
question. Every lookup-in sub-question of the TRAIN part gets one padded twin, also labelled
sufficient (0): the question inside one of PADDING's neutral clauses (they add words, not facts,
and name nothing a passage could hold), the clause picked by the SHA-256 of the question's text.
The twin runs the same real retrieval; its classifier output comes from the router of its
source's fold, and no twin fits a router. Val and the dev test part get no twins: L2 and the
threshold are tuned, and the eval reports, on real questions only.

Classifier features without leakage: the shipped router was fitted on train+val, so its
probabilities there are in-sample and overconfident. Train rows get cross-fitted ones (5 folds by
parent, a router refitted on the other folds with the shipped router's L2), val rows those of a
router fitted on train alone; in service the shipped router sees new questions, as these do.

Fit: class-balanced logistic regression on standardised features, Newton's method from zero, on
TRAIN only; the L2 strength is chosen on val (AUC), and the threshold on val by the criterion of
`bench/escalation_eval.py`: the most multihop escalation with at most 10% lookup-in escalation.
Nothing is random and every float is rounded, so the same data gives the same file byte for byte.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.retrieval.base import Vector  # noqa: E402
from bench.escalation_eval import (  # noqa: E402
    MAX_LOOKUP_ESCALATION,
    Graded,
    auc,
    embed,
    grade_all,
)
from bench.retrieval_eval import corpus_digest  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from routers.grading import learned_features  # noqa: E402
from routers.learned import CLASSES  # noqa: E402
from routers.learned import DEFAULT_MODEL_PATH as ROUTER_MODEL_PATH  # noqa: E402
from routers.sufficiency import (  # noqa: E402
    ARTIFACT_FORMAT,
    DEFAULT_MODEL_PATH,
    SUFFICIENCY_FEATURES,
)
from routers.types import Classification  # noqa: E402
from scripts.train_router import (  # noqa: E402
    SIGNIFICANT_DIGITS,
    Example,
    _rounded,
    _sha256,
    fanoutqa_path,
    feature_matrix,
    fit_router,
    labels_of,
    load_examples,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

TRAIN_COMMAND = "python scripts/train_sufficiency.py"
FOLDS = 5
L2_GRID = (1e-3, 1e-2, 1e-1, 1.0)
NEWTON_MAX_STEPS = 50
NEWTON_TOLERANCE = 1e-10
POPULATIONS = ("multihop", "lookup-in")  # label 1, label 0
PADDING = (
    "I am writing a short report and want to check one detail before I hand it in: {}",
    "{} I need it for a school project, so a short answer with its source is enough.",
    "My friend and I were arguing about this over dinner last night, please settle it: {}",
    "{} I read about this a while ago but cannot remember the details any more.",
)


# -- the fit: pure numpy, what the reproducibility test runs ---------------------------------


def fit_logistic(z: F64, y: I64, l2: float) -> tuple[F64, float]:
    """Class-balanced L2 logistic regression on standardised `z` (bias unpenalised), by Newton's
    method with step halving: exact, a few steps, and deterministic from a zero start."""
    n, d = z.shape
    counts = np.bincount(y, minlength=2)
    sample_w = (n / (2 * np.maximum(counts, 1)))[y] / n
    x = np.column_stack([z, np.ones(n)])
    penalty = np.append(np.full(d, l2), 0.0)
    w = np.zeros(d + 1)

    def loss(v: F64) -> float:
        margin = x @ v
        return float(
            (sample_w * (np.logaddexp(0, margin) - y * margin)).sum()
            + 0.5 * (penalty * v * v).sum()
        )

    for _ in range(NEWTON_MAX_STEPS):
        p = 1 / (1 + np.exp(-(x @ w)))
        grad = x.T @ (sample_w * (p - y)) + penalty * w
        hessian = (x * (sample_w * p * (1 - p))[:, None]).T @ x + np.diag(penalty + 1e-12)
        step = np.linalg.solve(hessian, grad)
        scale, current = 1.0, loss(w)
        while loss(w - scale * step) > current and scale > 1e-6:
            scale /= 2
        w = w - scale * step
        if np.abs(scale * step).max() < NEWTON_TOLERANCE:
            break
    return w[:-1], float(w[-1])


def _probabilities(model: dict[str, Any], x: F64) -> F64:
    """What `SufficiencyModel.probability` computes, for many rows, from the rounded artifact."""
    z = (x - np.array(model["mean"])) / np.array(model["scale"])
    return np.asarray(1 / (1 + np.exp(-(z @ np.array(model["weights"]) + model["bias"]))))


def _fitted(x: F64, y: I64, l2: float) -> dict[str, Any]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0  # a constant feature: leave it unscaled
    weights, bias = fit_logistic((x - mean) / scale, y, l2)
    model: dict[str, Any] = _rounded(
        {"mean": mean.tolist(), "scale": scale.tolist(), "weights": weights.tolist(), "bias": bias}
    )
    return model


def rates(p: F64, y: I64, threshold: float) -> tuple[float, float]:
    """(multihop escalation, lookup-in escalation) when P > threshold escalates."""
    escalated = p > threshold
    return float(escalated[y == 1].mean()), float(escalated[y == 0].mean())


def choose_threshold(p: F64, y: I64) -> float:
    """Max multihop escalation s.t. lookup-in escalation <= 10%; ties to the lower lookup-in
    rate, then the higher threshold. Candidates sit midway between adjacent val probabilities,
    so rounding the threshold cannot move a val question across it."""
    values = np.unique(p)
    candidates = [
        1.0,
        *(float(f"{t:.{SIGNIFICANT_DIGITS}g}") for t in (values[:-1] + values[1:]) / 2),
    ]
    feasible = [(rates(p, y, t), t) for t in candidates]
    feasible = [f for f in feasible if f[0][1] <= MAX_LOOKUP_ESCALATION]
    return max(feasible, key=lambda f: (f[0][0], -f[0][1], f[1]))[1]


def fit_sufficiency(x_train: F64, y_train: I64, x_val: F64, y_val: I64) -> dict[str, Any]:
    """L2 by val AUC (ties to the stronger penalty), fit on train, threshold on val."""
    by_l2 = {}
    for l2 in L2_GRID:
        model = _fitted(x_train, y_train, l2)
        p = _probabilities(model, x_val)
        by_l2[l2] = round(auc(-p[y_val == 1], -p[y_val == 0]), 9)
    best_l2 = max(L2_GRID, key=lambda l2: (by_l2[l2], l2))
    model = _fitted(x_train, y_train, best_l2)
    p_val = _probabilities(model, x_val)
    threshold = choose_threshold(p_val, y_val)
    multihop_rate, lookup_rate = rates(p_val, y_val, threshold)
    fit: dict[str, Any] = _rounded(
        {
            **model,
            "threshold": threshold,
            "l2": best_l2,
            "metrics": {
                "val_auc_by_l2": {f"{l2:g}": by_l2[l2] for l2 in L2_GRID},
                "val_multihop_escalated": multihop_rate,
                "val_lookup_in_escalated": lookup_rate,
                "val_counts": {"multihop": int(y_val.sum()), "lookup-in": int((1 - y_val).sum())},
                "train_counts": {
                    "multihop": int(y_train.sum()),
                    "lookup-in": int((1 - y_train).sum()),
                },
            },
        }
    )
    return fit


# -- the data: classifier scores without leakage, the real retrieval --------------------------


def _fold(example: Example) -> int:
    key = example.group if example.group != "direct" else f"direct:{example.text}"
    return int(hashlib.sha256(f"fold:{key}".encode()).hexdigest()[:8], 16) % FOLDS


def _classification(weights: F64, row: F64) -> Classification:
    logits = weights @ row
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    best = int(probs.argmax())
    scores = {str(c): float(p) for c, p in zip(CLASSES, probs, strict=True)}
    return Classification(CLASSES[best], float(probs[best]), scores=scores)


def classifier_outputs(
    examples: Sequence[Example], vectors: Vector, generated: int
) -> list[Classification]:
    """Out-of-sample router outputs for train (cross-fitted) and val (fitted on train) rows.
    The last `generated` examples are padded twins: predicted by their source's fold, never
    fitted (the shipped router never saw them)."""
    l2 = float(json.loads(ROUTER_MODEL_PATH.read_text("utf-8"))["training"]["l2"])
    x, y = feature_matrix(examples, vectors), labels_of(examples)
    split = np.array([e.split for e in examples])
    fits = (split == "train") & (np.arange(len(examples)) < len(examples) - generated)
    fold = np.array([_fold(e) if e.split == "train" else -1 for e in examples])
    held_out = [(fold == f, fits & (fold != f)) for f in range(FOLDS)]
    held_out.append((split == "val", fits))
    out: dict[int, Classification] = {}
    for predict_rows, fit_rows in held_out:
        weights = fit_router(x[fit_rows], y[fit_rows], l2)
        out.update((int(i), _classification(weights, x[i])) for i in np.flatnonzero(predict_rows))
    return [out[i] for i in range(len(examples))]


def feature_rows(graded: Sequence[Graded], outputs: Sequence[Classification]) -> F64:
    return np.stack(
        [
            learned_features(g.example.text, g.hits, c, g.best_possible)[0]
            for g, c in zip(graded, outputs, strict=True)
        ]
    )


def padded(example: Example) -> Example:
    """The question inside a neutral clause, chosen by the hash of its text (see PADDING)."""
    digest = hashlib.sha256(f"pad:{example.text}".encode()).hexdigest()
    return replace(example, text=PADDING[int(digest[:8], 16) % len(PADDING)].format(example.text))


def graded_with_twins(
    examples: list[Example],
) -> tuple[list[Example], list[Graded], Vector, str, int]:
    """Every example through the lookup path, then the padded twins of the train part's
    lookup-in ones (keeping their source's population: the same evidence page answers them)."""
    vectors, model_id = asyncio.run(embed([e.text for e in examples]))
    graded = asyncio.run(grade_all(examples, vectors))
    sources = [g for g in graded if g.example.split == "train" and g.population == "lookup-in"]
    twins = [padded(g.example) for g in sources]
    twin_vectors, _ = asyncio.run(embed([t.text for t in twins]))
    twin_graded = asyncio.run(grade_all(twins, twin_vectors))
    graded += [replace(g, population="lookup-in") for g in twin_graded]
    all_vectors = np.concatenate([vectors, twin_vectors])
    return examples + twins, graded, all_vectors, model_id, len(twins)


def train() -> dict[str, Any]:
    examples = [e for e in load_examples() if e.split in ("train", "val")]
    examples, graded, vectors, model_id, generated = graded_with_twins(examples)
    outputs = classifier_outputs(examples, vectors, generated)
    keep = [i for i, g in enumerate(graded) if g.population in POPULATIONS and g.hits]
    rows = feature_rows([graded[i] for i in keep], [outputs[i] for i in keep])
    y = np.array([int(graded[i].population == "multihop") for i in keep], dtype=np.int64)
    is_train = np.array([graded[i].example.split == "train" for i in keep])
    fit = fit_sufficiency(rows[is_train], y[is_train], rows[~is_train], y[~is_train])
    fitted = [graded[i] for i, t in zip(keep, is_train, strict=True) if t]
    dev = fanoutqa_path("fanout-final-dev.json")
    return {
        "format": ARTIFACT_FORMAT,
        "feature_names": list(SUFFICIENCY_FEATURES),
        "embedding_model_id": model_id,
        "mean": fit.pop("mean"),
        "scale": fit.pop("scale"),
        "weights": fit.pop("weights"),
        "bias": fit.pop("bias"),
        "threshold": fit.pop("threshold"),
        "training": {
            "command": TRAIN_COMMAND,
            "data_sha256": {
                "fanoutqa/data/fanout-final-dev.json": _sha256(dev.read_bytes()),
                "corpus": corpus_digest(load_wiki_sample(), model_id),
                "routers/router_model.json": _sha256(ROUTER_MODEL_PATH.read_bytes()),
                "fitted_examples": _sha256(
                    "\n".join(f"{g.population}\t{g.example.text}" for g in fitted).encode()
                ),
            },
            "labels": "multihop parent = 1 (insufficient), lookup-in sub-question = 0",
            "fitted_on": "train part of the dev split (scripts/train_router.py's split)",
            "l2": fit.pop("l2"),
            "metrics": fit.pop("metrics"),
            "generated": {"padded lookup-in twins of train sub-questions": generated},
            "notes": [
                "classifier features: cross-fitted on train, router fitted on train for val",
                "padded twins: train part only, label 0, never fit a router (see the script)",
                "threshold: max val multihop escalation s.t. val lookup-in escalation <= 10%",
                "FanOutQA test file never used; the dev test part is held out for the eval",
            ],
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_PATH)
    args = parser.parse_args(argv)
    artifact = train()
    args.out.write_text(json.dumps(artifact, indent=1) + "\n", "utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    print(json.dumps(artifact["training"]["metrics"], indent=1))


if __name__ == "__main__":
    main()
