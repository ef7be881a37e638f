"""Route evaluation: how well each routing policy labels held-out questions, what it would cost,
and what the classifiers cost to run.

    python bench/route_eval.py                 # the held-out test part of FanOutQA dev
    python bench/route_eval.py --final-test    # once, at the end: the FanOutQA test file

Also, after the dev table: the style-shifted held-out set (`routers/data/style_shift_eval.jsonl`,
written by `scripts/generate_router_data.py` from templates and entities its training file does
not use), and calibration: the top-label expected calibration error (10 bins) of the shipped
router on the dev test part and on the style-shifted set, before and after its temperature (the
router is fitted on train, the temperature on val by `scripts/train_router.py`, which folds it
into the weights: "before" multiplies it back out). The classifier here is the router alone; the
lookup path's escalation, which catches most of what it leaves, is `bench/escalation_eval.py`.

Data: the test part of the split made by `scripts/train_router.py` (by parent id, so no parent or
sub-question of it was trained or tuned on): FanOutQA parents = multihop, their leaf sub-questions =
lookup, plus the held-out lines of the synthetic direct set. The "fanoutqa acc" column leaves the
synthetic direct lines out. Intervals are 95% bootstrap intervals resampling whole parents.

Policies: always-lookup, always-multihop, the HeuristicClassifier, the LearnedClassifier, and the
oracle (true labels: the ceiling a better router could reach).

Cost model. ASSUMPTIONS, NOT MEASUREMENTS; every figure is a flag:
- direct   = 1 small-model call of ~200 prompt + ~100 completion tokens (no retrieval);
- lookup   = 1 small-model call of ~1,800 prompt tokens (question + ~5 retrieved chunks of ~300
             tokens + instructions) + ~150 completion tokens;
- multihop = 5 large-model agent steps averaging ~3,000 prompt tokens (the context grows with every
             tool result) + ~250 completion tokens each.
- prices in USD per million tokens: small 0.15 in / 0.60 out, large 2.50 in / 10.00 out.
Misrouting's quality cost is not priced: a multihop question sent to lookup is cheap but likely
answered incompletely unless the lookup path escalates it, so read "multihop recall" beside "$/q".

Classifier overhead is per classify() call on one query, excluding the embedding (the gateway
computes that once per request for the cache anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import Vector  # noqa: E402
from routers.classifier import Classifier, HeuristicClassifier  # noqa: E402
from routers.learned import CLASSES, LearnedClassifier  # noqa: E402
from routers.types import Route  # noqa: E402
from scripts.train_router import (  # noqa: E402
    Example,
    expected_calibration_error,
    fanoutqa_path,
    labels_of,
    load_examples,
    metrics,
    style_shift_examples,
)

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 20240601
TIMING_PASSES = 5


@dataclass(frozen=True, slots=True)
class RouteCost:
    calls: float
    prompt_tokens: float
    completion_tokens: float
    usd: float


def route_costs(args: argparse.Namespace) -> dict[Route, RouteCost]:
    def cost(calls: float, prompt: float, completion: float, large: bool) -> RouteCost:
        price_in, price_out = (
            (args.large_in, args.large_out) if large else (args.small_in, args.small_out)
        )
        usd = calls * (prompt * price_in + completion * price_out) / 1e6
        return RouteCost(calls, calls * prompt, calls * completion, usd)

    return {
        Route.DIRECT: cost(1, args.direct_prompt, args.direct_completion, large=False),
        Route.LOOKUP: cost(1, args.lookup_prompt, args.lookup_completion, large=False),
        Route.MULTIHOP: cost(args.multihop_steps, args.step_prompt, args.step_completion, True),
    }


def predictions(
    classifier: Classifier, texts: Sequence[str], vectors: Vector
) -> tuple[I64, list[float]]:
    """Predicted class indices, and per-call overhead samples in microseconds."""
    predicted = [
        CLASSES.index(classifier.classify(t, v).route) for t, v in zip(texts, vectors, strict=True)
    ]
    samples: list[float] = []
    for _ in range(TIMING_PASSES):
        for text, vector in zip(texts, vectors, strict=True):
            start = time.perf_counter_ns()
            classifier.classify(text, vector)
            samples.append((time.perf_counter_ns() - start) / 1000)
    return np.array(predicted, dtype=np.int64), samples


def bootstrap(
    groups: Sequence[str], y: I64, pred: I64, statistic: Callable[[I64, I64], float]
) -> tuple[float, float]:
    """95% interval of `statistic` resampling whole groups (a parent with its sub-questions)."""
    names = sorted(set(groups))
    rows_of = {g: np.flatnonzero(np.array(groups) == g) for g in names}
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    values = []
    for _ in range(BOOTSTRAP_SAMPLES):
        rows = np.concatenate([rows_of[names[i]] for i in rng.integers(0, len(names), len(names))])
        values.append(statistic(y[rows], pred[rows]))
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return float(low), float(high)


def _accuracy(y: I64, pred: I64) -> float:
    return float((y == pred).mean())


def _multihop_recall(y: I64, pred: I64) -> float:
    multihop = CLASSES.index(Route.MULTIHOP)
    rows = y == multihop
    return float((pred[rows] == multihop).mean()) if rows.any() else float("nan")


def print_table(
    examples: Sequence[Example], y: I64, preds: dict[str, I64], costs: dict[Route, RouteCost]
) -> None:
    # Direct lines are each their own group: they are independent hand-written examples.
    groups = [e.group if e.route is not Route.DIRECT else f"direct:{e.text}" for e in examples]
    real = np.array([e.route is not Route.DIRECT for e in examples])
    header = (
        f"{'policy':<16}{'acc':>6}{'acc 95% CI':>14}{'fanoutqa acc':>13}"
        + "".join(f"{'P/R ' + str(c)[:6]:>15}" for c in CLASSES)
        + f"{'calls/q':>9}{'prompt/q':>10}{'compl/q':>9}{'$/q':>10}"
    )
    print(header)
    for name, pred in preds.items():
        m = metrics(y, pred)
        low, high = bootstrap(groups, y, pred, _accuracy)
        per_class = "".join(
            f"{m['precision'][str(c)]:>8.3f}/{m['recall'][str(c)]:.3f}" for c in CLASSES
        )
        spent = [costs[CLASSES[k]] for k in pred]
        print(
            f"{name:<16}{m['accuracy']:>6.3f}{f'[{low:.3f},{high:.3f}]':>14}"
            f"{_accuracy(y[real], pred[real]):>13.3f}{per_class}"
            f"{np.mean([c.calls for c in spent]):>9.2f}"
            f"{np.mean([c.prompt_tokens for c in spent]):>10.0f}"
            f"{np.mean([c.completion_tokens for c in spent]):>9.0f}"
            f"{np.mean([c.usd for c in spent]):>10.5f}"
        )
    print("\nmultihop recall (95% CI, by parent):")
    for name, pred in preds.items():
        low, high = bootstrap(groups, y, pred, _multihop_recall)
        print(f"  {name:<16}{_multihop_recall(y, pred):.3f} [{low:.3f},{high:.3f}]")
    print("\nconfusion matrices (rows true, columns predicted: direct, lookup, multihop):")
    for name, pred in preds.items():
        rows = "  ".join(
            f"{str(c)[:6]}{row}"
            for c, row in zip(CLASSES, metrics(y, pred)["confusion"], strict=True)
        )
        print(f"  {name:<16}{rows}")


def _print_overhead(overheads: dict[str, list[float]]) -> None:
    # On a shared machine the tail is mostly the scheduler, not the classifier: show the load.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nclassifier overhead per call, embedding excluded (microseconds; load avg {load}):")
    for name, samples in overheads.items():
        p50, p99 = np.percentile(samples, [50, 99])
        print(f"  {name:<16}p50 {p50:7.1f}   p99 {p99:7.1f}   (n={len(samples)})")


def dev_test_report(args: argparse.Namespace, embedder: MiniLMEmbedder) -> None:
    examples = [e for e in load_examples() if e.split == "test"]
    texts = [e.text for e in examples]
    vectors = embedder.embed_sync(texts)
    y = labels_of(examples)
    counts = {str(c): int((y == k).sum()) for k, c in enumerate(CLASSES)}
    parents = len({e.group for e in examples if e.route is not Route.DIRECT})
    print(f"held-out test part of FanOutQA dev: {parents} parents, {counts}")
    print("(the direct class is synthetic: hand-written lines, routers/data/direct_examples.txt)\n")
    preds, overheads = baseline_predictions(texts, vectors, y, embedder.model_id)
    print_table(examples, y, preds, route_costs(args))
    _print_overhead(overheads)
    style_and_calibration_report(embedder)


def probabilities(classifier: LearnedClassifier, texts: Sequence[str], vectors: Vector) -> F64:
    """Every class's probability (CLASSES order) per text."""
    rows = [
        [classifier.classify(t, v).scores[str(c)] for c in CLASSES]
        for t, v in zip(texts, vectors, strict=True)
    ]
    return np.array(rows, dtype=np.float64)


def _tempered(probs: F64, temperature: float) -> F64:
    # log p differs from the logits by a per-row constant, which a softmax ignores.
    logits = np.log(np.maximum(probs, 1e-300)) / temperature
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=1, keepdims=True), dtype=np.float64)


def _ece_with_interval(groups: Sequence[str], probs: F64, labels: I64) -> str:
    """ECE and its 95% bootstrap interval, resampling `groups`."""

    def ece(rows: I64, _: I64) -> float:
        return expected_calibration_error(probs[rows], labels[rows])

    rows = np.arange(len(labels), dtype=np.int64)
    low, high = bootstrap(groups, rows, rows, ece)
    return f"{expected_calibration_error(probs, labels):.3f} [{low:.3f},{high:.3f}]"


def style_and_calibration_report(embedder: MiniLMEmbedder) -> None:
    classifier = LearnedClassifier.load(embedding_model_id=embedder.model_id)
    dev = load_examples()
    parts = {
        "dev test": [e for e in dev if e.split == "test"],
        "style-shifted": style_shift_examples(),
    }
    vectors = {name: embedder.embed_sync([e.text for e in ex]) for name, ex in parts.items()}
    probs = {
        name: probabilities(classifier, [e.text for e in ex], vectors[name])
        for name, ex in parts.items()
    }
    temperature = float(classifier.model.training["temperature"])
    style = parts["style-shifted"]
    y = labels_of(style)
    pred, _ = predictions(classifier, [e.text for e in style], vectors["style-shifted"])
    groups = [e.group for e in style]
    print(f"\nstyle-shifted held-out set ({len(style)} rows, each its own bootstrap group):")
    multihop = CLASSES.index(Route.MULTIHOP)
    for label, route in (
        ("multihop recall", Route.MULTIHOP),
        ("lookup flagged multihop", Route.LOOKUP),
        ("direct flagged multihop", Route.DIRECT),
    ):
        rows = y == CLASSES.index(route)
        flagged = (pred[rows] == multihop).astype(np.int64)
        low, high = bootstrap(
            [g for g, r in zip(groups, rows, strict=True) if r],
            flagged,
            flagged,
            lambda a, _: float(a.mean()),
        )
        print(f"  {label:<26}{flagged.mean():.3f} [{low:.3f},{high:.3f}]  (n={int(rows.sum())})")
    low, high = bootstrap(groups, y, pred, _accuracy)
    print(f"  {'accuracy':<26}{_accuracy(y, pred):.3f} [{low:.3f},{high:.3f}]")
    for generator in sorted({e.generator for e in style}):
        rows = np.array([e.generator == generator for e in style])
        accuracy = _accuracy(y[rows], pred[rows])
        print(f"    {generator:<26}accuracy {accuracy:.3f} (n={int(rows.sum())})")
    fitted_on = classifier.model.training.get("fitted_on", "?")
    print(
        f"\ncalibration, top-label ECE (10 bins) with 95% bootstrap intervals; router fitted on "
        f"{fitted_on}, T = {temperature:g} fitted on val (folded into the shipped weights)"
    )
    for name, examples in parts.items():
        labels = labels_of(examples)
        groups = [e.group if e.route is not Route.DIRECT else e.text for e in examples]
        cells = [
            _ece_with_interval(groups, shown, labels)
            for shown in (_tempered(probs[name], 1 / temperature), probs[name])
        ]
        print(f"  {name:<16}before T {cells[0]}   after T (shipped) {cells[1]}   (n={len(labels)})")


def baseline_predictions(
    texts: Sequence[str], vectors: Vector, y: I64, embedding_model_id: str
) -> tuple[dict[str, I64], dict[str, list[float]]]:
    """Each policy's predicted class indices (oracle last), and the classifiers' overheads."""
    classifiers: dict[str, Classifier] = {
        "heuristic": HeuristicClassifier(),
        "learned": LearnedClassifier.load(embedding_model_id=embedding_model_id),
    }
    preds = {
        "always-lookup": np.full(len(y), CLASSES.index(Route.LOOKUP), dtype=np.int64),
        "always-multihop": np.full(len(y), CLASSES.index(Route.MULTIHOP), dtype=np.int64),
    }
    overheads: dict[str, list[float]] = {}
    for name, classifier in classifiers.items():
        preds[name], overheads[name] = predictions(classifier, texts, vectors)
    preds["oracle"] = y
    return preds, overheads


def final_test_report(embedder: MiniLMEmbedder) -> None:
    """FanOutQA test: questions only, all multi-hop. Report it; never tune after reading it."""
    questions = [
        q["question"] for q in json.loads(fanoutqa_path("fanout-final-test.json").read_text())
    ]
    vectors = embedder.embed_sync(questions)
    classifiers: dict[str, Classifier] = {
        "heuristic": HeuristicClassifier(),
        "learned": LearnedClassifier.load(embedding_model_id=embedder.model_id),
    }
    print(f"FanOutQA test: {len(questions)} questions, all multihop (reserved split, untuned)")
    for name, classifier in classifiers.items():
        routes = [classifier.classify(q, v).route for q, v in zip(questions, vectors, strict=True)]
        shares = {str(c): sum(r is c for r in routes) for c in CLASSES}
        recall = shares[str(Route.MULTIHOP)] / len(questions)
        print(f"  {name:<12}multihop recall {recall:.3f}   routed {shares}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--final-test", action="store_true", help="run on the FanOutQA test file")
    prices = parser.add_argument_group("prices, USD per million tokens")
    prices.add_argument("--small-in", type=float, default=0.15)
    prices.add_argument("--small-out", type=float, default=0.60)
    prices.add_argument("--large-in", type=float, default=2.50)
    prices.add_argument("--large-out", type=float, default=10.00)
    tokens = parser.add_argument_group("token assumptions per route")
    tokens.add_argument("--direct-prompt", type=float, default=200)
    tokens.add_argument("--direct-completion", type=float, default=100)
    tokens.add_argument("--lookup-prompt", type=float, default=1800)
    tokens.add_argument("--lookup-completion", type=float, default=150)
    tokens.add_argument("--multihop-steps", type=float, default=5)
    tokens.add_argument("--step-prompt", type=float, default=3000)
    tokens.add_argument("--step-completion", type=float, default=250)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    embedder = MiniLMEmbedder()
    if args.final_test:
        final_test_report(embedder)
    else:
        dev_test_report(args, embedder)


if __name__ == "__main__":
    main()
