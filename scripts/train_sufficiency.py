"""Train the learned sufficiency model and write `routers/sufficiency_model.json`.

    python scripts/train_sufficiency.py [--out PATH]
    python scripts/train_sufficiency.py --check    # retrain in memory, diff against the artifact
    python scripts/train_sufficiency.py --rerank local --out PATH   # on reranked evidence

Run it after `scripts/train_router.py`: it reads the router artifact (its L2, temperature and
multihop margin) and records its digest.

Data: the tuning part (train+val) of the split of `scripts/train_router.py` (FanOutQA dev, by
parent; the dev test part is held out for `bench/escalation_eval.py`, the FanOutQA test file is
never read). Each question runs the lookup path's real retrieval over the 10,033 Wikipedia lead
sections in the embedded index, with the committed retrieval defaults (`bench/escalation_eval.py`'s
`run_lookup`; the index is built and cached by `bench/retrieval_eval.py`'s helpers on the first
run). `--rerank local` grades the hits the lookup's rerank stage leaves with the local
cross-encoder behind the shipped policy (the artifact records it under `training.retrieval`).
Labels: parent questions = insufficient (1); leaf sub-questions whose evidence page is in
the corpus ("lookup-in") = sufficient (0). Sub-questions whose page the corpus lacks are left out
of the fit (their evidence is thin for a reason no feature of the question can know) and
reported.

Long single-hop questions, generated: FanOutQA's parents are long and its sub-questions short, so
length alone separates the labels and a model fitted on them escalates any long question. Every
lookup-in sub-question of the tuning part gets one padded twin, also labelled sufficient (0): the
question inside one of PADDING's neutral clauses (they add words, not facts, and name nothing a
passage could hold), the clause picked by the SHA-256 of the question's text. The twin runs the
same real retrieval and shares its source's fold.

Classifier features without leakage: every row's router output comes from the router of its fold
(`scripts/train_router.py`'s folds, fitted like the shipped router on the other folds of its
training data, the shipped temperature and margin applied), so it is out of sample, as the
shipped router's output on a new question is.

Fit: class-balanced logistic regression on standardised features, Newton's method from zero. The
L2 strength by out-of-fold AUC (multihop against lookup-in); the shipped model is fitted on every
tuning row. The threshold is chosen jointly with the router's margin on out-of-fold
probabilities: a question is flagged multihop when the router says so or when it reaches lookup
and P(insufficient) exceeds the threshold (a lookup with no hits always escalates); the threshold
flags the fewest lookup-in questions with at least TARGET_RECALL of the multihop questions
flagged (ties: fewer lookup-out flagged, then the higher threshold). The frontier over other
router margins is printed and stored, to check the router's margin against.
Nothing is random and every float is rounded, so the same data gives the same file byte for byte.
"""

from __future__ import annotations

import os

for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_threads] = "1"  # one BLAS thread: the same sums in the same order

import argparse  # noqa: E402
import asyncio  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import Vector  # noqa: E402
from bench.escalation_eval import RERANKERS, Graded, auc, grade_all  # noqa: E402
from bench.retrieval_eval import corpus_digest  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.settings import RetrievalConfig  # noqa: E402
from routers.grading import learned_features  # noqa: E402
from routers.learned import CLASSES, route_index  # noqa: E402
from routers.learned import DEFAULT_MODEL_PATH as ROUTER_MODEL_PATH  # noqa: E402
from routers.sufficiency import (  # noqa: E402
    ARTIFACT_FORMAT,
    DEFAULT_MODEL_PATH,
    SUFFICIENCY_FEATURES,
)
from routers.types import Classification, Route  # noqa: E402
from scripts.train_router import (  # noqa: E402
    FOLDS,
    SIGNIFICANT_DIGITS,
    Example,
    _rounded,
    _sha256,
    check,
    fanoutqa_path,
    feature_matrix,
    fold_of,
    fold_weights,
    labels_of,
    margins,
    render,
    training_examples,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

TRAIN_COMMAND = "python scripts/train_sufficiency.py"
L2_GRID = (1e-3, 1e-2, 1e-1, 1.0)
NEWTON_MAX_STEPS = 50
NEWTON_TOLERANCE = 1e-10
POPULATIONS = ("multihop", "lookup-in")  # label 1, label 0
# Multihop recall (router and escalation together) the threshold must keep on the tuning part.
TARGET_RECALL = 0.95
FRONTIER_MARGINS = tuple(round(0.25 * i, 2) for i in range(-2, 13))
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


# -- the operating point: router margin and threshold together ---------------------------------


@dataclass(frozen=True, slots=True)
class TuningRows:
    """Out-of-fold what the gateway would see for each tuning question."""

    population: npt.NDArray[np.str_]  # multihop | lookup-in | lookup-out | direct
    margin: F64  # the router's multihop margin (calibrated logits)
    lookup: Bools  # below the margin, the router's route would be lookup (not direct)
    p: F64  # P(insufficient) of the lookup's evidence; 1 where the lookup found nothing


def flagged(rows: TuningRows, multihop_margin: float, threshold: float) -> Bools:
    """Ends on the multihop route: classified multihop, or a lookup whose grade escalates."""
    by_router = rows.margin > multihop_margin
    return by_router | (~by_router & rows.lookup & (rows.p > threshold))


def shares(rows: TuningRows, flags: Bools) -> dict[str, float]:
    return {
        name: float(flags[rows.population == name].mean())
        for name in ("multihop", "lookup-in", "lookup-out", "direct")
        if (rows.population == name).any()
    }


def choose_threshold(rows: TuningRows, multihop_margin: float) -> tuple[float, dict[str, float]]:
    """The fewest lookup-in questions flagged with at least TARGET_RECALL of the multihop ones
    (ties: fewer lookup-out, then the higher threshold); if no threshold reaches it, the highest
    recall. Candidates sit midway between adjacent probabilities, so rounding the threshold
    cannot move a tuning question across it."""
    values = np.unique(rows.p)
    candidates = [
        1.0,
        *(float(f"{t:.{SIGNIFICANT_DIGITS}g}") for t in (values[:-1] + values[1:]) / 2),
    ]
    scored = [(shares(rows, flagged(rows, multihop_margin, t)), t) for t in candidates]
    feasible = [(s, t) for s, t in scored if s["multihop"] >= TARGET_RECALL]
    if feasible:
        best = min(feasible, key=lambda f: (f[0]["lookup-in"], f[0].get("lookup-out", 0.0), -f[1]))
    else:
        best = min(scored, key=lambda f: (-f[0]["multihop"], f[0]["lookup-in"], -f[1]))
    return best[1], best[0]


# -- the data: classifier scores without leakage, the real retrieval --------------------------


def _classification(logits: F64, multihop_margin: float) -> Classification:
    """What `LearnedClassifier.classify` returns for these (calibrated) logits."""
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    best = route_index(logits, multihop_margin)
    scores = {str(c): float(p) for c, p in zip(CLASSES, probs, strict=True)}
    return Classification(CLASSES[best], float(probs[best]), scores=scores)


def router_logits(
    router: dict[str, Any],
    examples: Sequence[Example],
    vectors: Vector,
    extra: Sequence[Example],
    extra_vectors: Vector,
) -> tuple[F64, F64]:
    """Out-of-fold calibrated router logits for `examples` (the router's training examples, in
    its order) and for `extra` rows (padded twins): each from the router fitted, as the shipped
    one was, on the tuning rows outside its fold."""
    x, y = feature_matrix(examples, vectors), labels_of(examples)
    weight = np.array([e.weight for e in examples], dtype=np.float64)
    tune = np.array([e.split in ("train", "val") for e in examples])
    folds = np.array([fold_of(e) for e in examples], dtype=np.int64)
    per_fold = fold_weights(x, y, weight, folds, tune, float(router["training"]["l2"]))
    temperature = float(router["training"]["temperature"])

    def scored(xs: F64, fs: I64) -> F64:
        out = np.full((len(xs), len(CLASSES)), np.nan)
        for f, w in enumerate(per_fold):
            out[fs == f] = xs[fs == f] @ w.T / temperature
        return out

    extra_folds = np.array([fold_of(e) for e in extra], dtype=np.int64)
    return scored(x, folds), scored(feature_matrix(extra, extra_vectors), extra_folds)


def padded(example: Example) -> Example:
    """The question inside a neutral clause, chosen by the hash of its text (see PADDING)."""
    digest = hashlib.sha256(f"pad:{example.text}".encode()).hexdigest()
    return replace(example, text=PADDING[int(digest[:8], 16) % len(PADDING)].format(example.text))


def tuning_data(reranker: str = "off") -> tuple[list[Graded], F64, dict[str, Any], str, int]:
    """Every tuning question (and the padded twins of its lookup-in ones, last) through the
    lookup path (`reranker`: its rerank stage), with its out-of-fold router logits; the router
    artifact; the embedding model."""
    router = json.loads(ROUTER_MODEL_PATH.read_text("utf-8"))
    examples = training_examples()
    embedder = MiniLMEmbedder()
    vectors = embedder.embed_sync([e.text for e in examples])
    dev = [i for i, e in enumerate(examples) if e.weight == 1.0 and e.split in ("train", "val")]
    graded = asyncio.run(grade_all([examples[i] for i in dev], vectors[dev], reranker))
    sources = [g for g in graded if g.population == "lookup-in"]
    twins = [padded(g.example) for g in sources]
    twin_vectors = embedder.embed_sync([t.text for t in twins])
    graded += [
        replace(g, population="lookup-in")
        for g in asyncio.run(grade_all(twins, twin_vectors, reranker))
    ]
    logits, twin_logits = router_logits(router, examples, vectors, twins, twin_vectors)
    return graded, np.concatenate([logits[dev], twin_logits]), router, embedder.model_id, len(twins)


def feature_rows(graded: Sequence[Graded], outputs: Sequence[Classification]) -> F64:
    return np.stack(
        [
            learned_features(g.example.text, g.hits, c, g.best_possible)[0]
            if g.hits
            else np.full(len(SUFFICIENCY_FEATURES), np.nan)
            for g, c in zip(graded, outputs, strict=True)
        ]
    )


def fit_sufficiency(
    x: F64, y: I64, fit: Bools, folds: I64
) -> tuple[dict[str, Any], F64, dict[float, float]]:
    """L2 by out-of-fold AUC over the `fit` rows (ties to the stronger penalty); the model
    fitted on every `fit` row; out-of-fold P(insufficient) for every row with features."""
    has = ~np.isnan(x).any(axis=1)
    oof_by_l2: dict[float, F64] = {}
    for l2 in L2_GRID:
        p = np.full(len(x), np.nan)
        for f in range(FOLDS):
            model = _fitted(x[fit & (folds != f)], y[fit & (folds != f)], l2)
            rows = has & (folds == f)
            p[rows] = _probabilities(model, x[rows])
        oof_by_l2[l2] = p
    auc_by_l2 = {
        l2: round(auc(-p[fit & (y == 1)], -p[fit & (y == 0)]), 9) for l2, p in oof_by_l2.items()
    }
    best = max(L2_GRID, key=lambda l2: (auc_by_l2[l2], l2))
    model = _fitted(x[fit], y[fit], best)
    model["l2"] = best
    return model, oof_by_l2[best], auc_by_l2


def train(reranker: str = "off") -> dict[str, Any]:
    graded, logits, router, model_id, twins = tuning_data(reranker)
    margin = float(router["decision"]["multihop_margin"])
    outputs = [_classification(row, margin) for row in logits]
    x = feature_rows(graded, outputs)
    population = np.array([g.population for g in graded])
    y = (population == "multihop").astype(np.int64)
    has_hits = np.array([bool(g.hits) for g in graded])
    fit = np.isin(population, POPULATIONS) & has_hits
    folds = np.array([fold_of(g.example) for g in graded], dtype=np.int64)
    model, p, auc_by_l2 = fit_sufficiency(x, y, fit, folds)
    questions = np.arange(len(graded)) < len(graded) - twins  # the twins are not questions
    lookup = CLASSES.index(Route.LOOKUP)
    others = logits[:, [k for k in range(len(CLASSES)) if CLASSES[k] is not Route.MULTIHOP]]
    rows = TuningRows(
        population[questions],
        margins(logits)[questions],
        (np.argmax(others, axis=1) == lookup)[questions],
        np.where(has_hits, p, 1.0)[questions],
    )
    threshold, at = choose_threshold(rows, margin)
    frontier = {
        f"{m:g}": {"threshold": t, **s}
        for m in FRONTIER_MARGINS
        for t, s in [choose_threshold(rows, m)]
    }
    fitted = [g for g, f in zip(graded, fit, strict=True) if f]
    dev = fanoutqa_path("fanout-final-dev.json")
    config = RetrievalConfig()
    artifact: dict[str, Any] = _rounded(
        {
            "format": ARTIFACT_FORMAT,
            "feature_names": list(SUFFICIENCY_FEATURES),
            "embedding_model_id": model_id,
            "mean": model["mean"],
            "scale": model["scale"],
            "weights": model["weights"],
            "bias": model["bias"],
            "threshold": threshold,
            "training": {
                "command": TRAIN_COMMAND + (f" --rerank {reranker}" if reranker != "off" else ""),
                "data_sha256": {
                    "fanoutqa/data/fanout-final-dev.json": _sha256(dev.read_bytes()),
                    "corpus": corpus_digest(load_wiki_sample(), model_id),
                    "routers/router_model.json": _sha256(ROUTER_MODEL_PATH.read_bytes()),
                    "fitted_examples": _sha256(
                        "\n".join(f"{g.population}\t{g.example.text}" for g in fitted).encode()
                    ),
                },
                "retrieval": {
                    "fusion": str(config.fusion),
                    "k": config.k,
                    "candidates": config.candidates,
                    # Named only when on: the fused-evidence artifact's bytes stay as they are.
                    **({"rerank": reranker} if reranker != "off" else {}),
                },
                "labels": "multihop parent = 1 (insufficient), lookup-in sub-question = 0",
                "fitted_on": "train+val of the dev split (scripts/train_router.py's), with twins",
                "l2": model["l2"],
                "metrics": {
                    "out_of_fold_auc_by_l2": {f"{l2:g}": auc_by_l2[l2] for l2 in L2_GRID},
                    "router_multihop_margin": margin,
                    "target_recall": TARGET_RECALL,
                    "out_of_fold_flagged_multihop": at,
                    "counts": {
                        name: int((rows.population == name).sum())
                        for name in ("multihop", "lookup-in", "lookup-out", "direct")
                    },
                    "frontier_by_router_margin": frontier,
                },
                "generated": {"padded lookup-in twins of tuning sub-questions": twins},
                "notes": [
                    "classifier features: each row's router fitted on the other folds",
                    "padded twins: tuning part only, label 0, never fit a router (see the script)",
                    "threshold: fewest lookup-in flagged (router or escalation, out of fold) with "
                    "target_recall of multihop flagged, at the router's margin",
                    "FanOutQA test file never used; the dev test part is held out for the eval",
                ],
            },
        }
    )
    return artifact


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument(
        "--check", action="store_true", help="retrain in memory and diff against --out"
    )
    parser.add_argument(
        "--rerank",
        choices=RERANKERS,
        default="off",
        help="the lookup's rerank stage the grade reads behind (bench/escalation_eval.py's)",
    )
    args = parser.parse_args(argv)
    artifact = train(args.rerank)
    produced = render(artifact)
    if args.check:
        raise SystemExit(check(args.out.read_bytes(), produced, args.out))
    args.out.write_bytes(produced)
    metrics = artifact["training"]["metrics"]
    print(f"wrote {args.out} ({len(produced)} bytes); threshold {artifact['threshold']}")
    print("out of fold, router margin", metrics["router_multihop_margin"], "->")
    print(" ", json.dumps(metrics["out_of_fold_flagged_multihop"]))
    print("frontier (router margin: threshold and flagged shares at the target recall):")
    for m, point in metrics["frontier_by_router_margin"].items():
        print(f"  {m:>5}: {json.dumps(point)}")


if __name__ == "__main__":
    main()
