"""Escalation calibration: tune the lookup grade's thresholds on FanOutQA dev val, report on test.

    python bench/escalation_eval.py [route_eval's price and token options]

The lookup route grades its evidence (`routers.grading.grade`: coverage of the question's content
words in the best passages, and agreement of the two arms on the best passage) and escalates to
multihop when either falls below its threshold. Here every question of the dev split made by
`scripts/train_router.py` (val and test parts) runs the lookup path's real retrieval: the
embedded index over the 10,033 Wikipedia lead sections built by `bench/retrieval_eval.py`,
k and candidates from `RetrievalConfig`, arm weights from the route policy (identifiers raise
the lexical weight).

Populations:
- lookup-in: leaf sub-questions whose evidence page is in the corpus: should NOT escalate;
- lookup-out: leaf sub-questions whose page is not in the corpus (escalating them is defensible:
  the corpus cannot answer them), reported apart;
- multihop: parent questions: SHOULD escalate when they reach the lookup route.

Criterion, fixed before looking at test: on val, maximise the multihop escalation rate subject to
at most 10% lookup-in escalation; ties go to the lower lookup-in rate, then to lower thresholds.
Test then reports the lookup-in escalation rate, the catch rate for multihop questions the learned
classifier sent to lookup, and route accuracy and cost of "learned + escalation" beside the
baselines of `bench/route_eval.py` (same table, same cost model: an escalated question costs a
multihop answer; the retrieval before the grade is not priced). The FanOutQA test file is never
read.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.retrieval.base import Hit, Retriever, SearchRequest, Vector  # noqa: E402
from bench.retrieval_eval import (  # noqa: E402
    TENANT,
    ensure_corpus,
    evidence_leaves,
    normalised,
    open_embedded,
    open_embedder,
)
from bench.route_eval import (  # noqa: E402
    baseline_predictions,
    parse_args,
    print_table,
    route_costs,
)
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.settings import RetrievalConfig  # noqa: E402
from routers.grading import GradeThresholds, best_possible_score, grade  # noqa: E402
from routers.learned import CLASSES, LearnedClassifier  # noqa: E402
from routers.policy import PolicyConfig, decide  # noqa: E402
from routers.rules import EscalationConfig  # noqa: E402
from routers.types import Classification, Route  # noqa: E402
from scripts.train_router import Example, fanoutqa_path, labels_of, load_examples  # noqa: E402

MAX_LOOKUP_ESCALATION = 0.10
GRID = tuple(round(x, 2) for x in np.arange(0.0, 1.0001, 0.05))
I64 = npt.NDArray[np.int64]
LOOKUP, MULTIHOP = CLASSES.index(Route.LOOKUP), CLASSES.index(Route.MULTIHOP)


@dataclass(frozen=True, slots=True)
class Graded:
    """One question through the lookup path: what the grade reads, and the hits it read."""

    example: Example
    population: str  # lookup-in | lookup-out | multihop | direct
    hits: list[Hit]
    best_possible: float
    coverage: float
    agreement: float


def population(example: Example, pages: dict[str, str], corpus: set[str]) -> str:
    if example.route is not Route.LOOKUP:
        return str(example.route)
    return "lookup-in" if pages.get(normalised(example.text)) in corpus else "lookup-out"


def evidence_pages() -> dict[str, str]:
    """Normalised leaf sub-question -> its evidence page title (first occurrence)."""
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    pages: dict[str, str] = {}
    for parent in dev:
        for question, page in evidence_leaves(parent):
            if page is not None:
                pages.setdefault(normalised(question), page)
    return pages


async def run_lookup(
    retriever: Retriever, example: Example, vector: Vector, population: str
) -> Graded:
    """The lookup route's retrieval and grade signals, as `routers.lookup.plan_lookup` runs."""
    config = RetrievalConfig()
    policy = PolicyConfig(
        tenant=TENANT,
        allow_force_route=False,
        lexical_weight=config.lexical_weight,
        dense_weight=config.dense_weight,
        identifier_lexical_weight=config.identifier_lexical_weight,
    )
    decision = decide(Classification(Route.LOOKUP, 1.0), "auto", example.text, policy)
    request = SearchRequest(
        tenant=TENANT,
        text=example.text,
        vector=vector,
        k=config.k,
        candidates=config.candidates,
        lexical_weight=decision.lexical_weight,
        dense_weight=decision.dense_weight,
    )
    hits = await retriever.search(request)
    best = best_possible_score(decision.lexical_weight, decision.dense_weight)
    # Zero thresholds: every grade is "sufficient", so this reads the two signals only.
    signals = grade(example.text, hits, GradeThresholds(0.0, 0.0), best)
    return Graded(example, population, hits, best, signals.coverage, signals.agreement)


def escalates(item: Graded, thresholds: GradeThresholds) -> bool:
    """What `plan_lookup` decides for these thresholds (checked against grade() in main)."""
    if not item.hits:
        return True
    return item.coverage < thresholds.min_coverage or item.agreement < thresholds.min_agreement


def rate(items: Sequence[Graded], thresholds: GradeThresholds) -> float:
    if not items:
        return float("nan")
    return sum(escalates(i, thresholds) for i in items) / len(items)


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a random positive scores below a random negative): how well low values flag positives."""
    pos, neg = np.array(positive)[:, None], np.array(negative)[None, :]
    return float((pos < neg).mean() + 0.5 * (pos == neg).mean())


def tune(val: Sequence[Graded]) -> tuple[GradeThresholds, list[tuple[float, float, Any]]]:
    """The criterion of the module docstring over the grid; also every feasible point."""
    lookups = [g for g in val if g.population == "lookup-in"]
    multihop = [g for g in val if g.population == "multihop"]
    feasible = []
    for coverage, agreement in itertools.product(GRID, GRID):
        t = GradeThresholds(coverage, agreement)
        lookup_rate = rate(lookups, t)
        if lookup_rate <= MAX_LOOKUP_ESCALATION:
            feasible.append((rate(multihop, t), lookup_rate, t))
    feasible.sort(key=lambda f: (-f[0], f[1], f[2].min_coverage + f[2].min_agreement))
    return feasible[0][2], feasible


def describe(items: Sequence[Graded], thresholds: GradeThresholds, label: str) -> str:
    parts = []
    for name in ("lookup-in", "lookup-out", "multihop", "direct"):
        group = [i for i in items if i.population == name]
        parts.append(f"{name} {rate(group, thresholds):.3f} (n={len(group)})")
    return f"  {label:<40}" + "   ".join(parts)


def top_cosine(item: Graded) -> float:
    """The best dense score among the hits: a candidate signal the grade does not use yet."""
    return max((h.dense_score for h in item.hits if h.dense_score is not None), default=0.0)


SIGNALS: dict[str, Callable[[Graded], float]] = {
    "coverage": lambda g: g.coverage,
    "agreement": lambda g: g.agreement,
    "top cosine (candidate, not in the grade)": top_cosine,
}


def print_val_routing(val: Sequence[Graded], vectors: Vector, model_id: str) -> None:
    """Why tuning uses every val multihop question, not only those the classifier misroutes."""
    learned = LearnedClassifier.load(embedding_model_id=model_id)
    multihop = [(g, v) for g, v in zip(val, vectors, strict=True) if g.population == "multihop"]
    missed = sum(learned.classify(g.example.text, v).route is Route.LOOKUP for g, v in multihop)
    print(
        f"learned sends {missed} of {len(multihop)} val multihop questions to lookup (in-sample: "
        "fitted on train+val), so tuning uses all of them"
    )


def print_separability(items: Sequence[Graded]) -> None:
    lookups = [g for g in items if g.population == "lookup-in"]
    multihop = [g for g in items if g.population == "multihop"]
    print("separability on val, AUC of a low signal flagging multihop against lookup-in:")
    for name, signal in SIGNALS.items():
        pos, neg = [signal(g) for g in multihop], [signal(g) for g in lookups]
        print(
            f"  {name:<42}AUC {auc(pos, neg):.3f}   median multihop {np.median(pos):.3f}"
            f"   median lookup-in {np.median(neg):.3f}"
        )


def with_escalation(pred: I64, graded: Sequence[Graded], t: GradeThresholds) -> I64:
    """A classifier's routes after the lookup path escalates what its grade finds thin."""
    escalated = np.array([escalates(g, t) for g in graded])
    return np.where((pred == LOOKUP) & escalated, MULTIHOP, pred).astype(np.int64)


def print_test_report(
    args: argparse.Namespace,
    test: Sequence[Graded],
    vectors: Vector,
    model_id: str,
    chosen: dict[str, GradeThresholds],
) -> None:
    examples = [g.example for g in test]
    y = labels_of(examples)
    preds, _ = baseline_predictions([e.text for e in examples], vectors, y, model_id)
    learned = preds["learned"]
    sent = [g for g, p in zip(test, learned, strict=True) if p == LOOKUP]
    print("\nTEST part of the dev split: escalation rates by population")
    for label, t in chosen.items():
        print(describe(test, t, label))
    print("\ncatch rate: multihop questions the learned classifier sent to lookup, escalated")
    caught = [g for g in sent if g.population == "multihop"]
    for label, t in chosen.items():
        print(f"  {label:<40}{rate(caught, t):.3f} (n={len(caught)})")
    oracle = preds.pop("oracle")
    for t in chosen.values():
        preds[f"lrn+esc {t.min_coverage:g}/{t.min_agreement:g}"] = with_escalation(learned, test, t)
    preds["oracle"] = oracle
    costs = route_costs(args)
    print("\nall test questions (comparable with bench/route_eval.py):")
    print_table(examples, y, preds, costs)
    keep = np.array([g.population != "lookup-out" for g in test])
    print(
        "\nwithout lookup-out (questions whose evidence the corpus lacks; escalating them is "
        "arguably right, and the label calls it wrong):"
    )
    subset = [e for e, k in zip(examples, keep, strict=True) if k]
    print_table(subset, y[keep], {n: p[keep] for n, p in preds.items()}, costs)


async def grade_all(examples: Sequence[Example], vectors: Vector) -> list[Graded]:
    docs = load_wiki_sample()
    corpus = {d.doc_id for d in docs}
    pages = evidence_pages()
    embedder = open_embedder()
    retriever = open_embedded()
    try:
        print(await ensure_corpus("embedded", retriever, docs, embedder))
        return [
            await run_lookup(retriever, e, v, population(e, pages, corpus))
            for e, v in zip(examples, vectors, strict=True)
        ]
    finally:
        await retriever.aclose()
        await embedder.aclose()


async def embed(texts: Sequence[str]) -> tuple[Vector, str]:
    embedder = open_embedder()
    try:
        return await embedder.embed(texts), embedder.model_id
    finally:
        await embedder.aclose()


def check_against_grade(items: Sequence[Graded], t: GradeThresholds) -> None:
    """The grid's fast rule must say what the route's own grade() says."""
    for item in items:
        sufficient = bool(item.hits) and grade(item.example.text, item.hits, t, item.best_possible)
        assert escalates(item, t) != bool(sufficient and sufficient.sufficient), item.example.text


def compared(tuned: GradeThresholds) -> dict[str, GradeThresholds]:
    """grading.py's own defaults, the configured defaults (routers/rules.py) and the tuned pair."""
    configured = EscalationConfig()
    candidates = {
        "grading": GradeThresholds(),
        "configured": GradeThresholds(configured.min_coverage, configured.min_agreement),
        "tuned": tuned,
    }
    labels: dict[GradeThresholds, list[str]] = {}
    for name, t in candidates.items():
        labels.setdefault(t, []).append(name)
    return {
        f"{'='.join(names)} (cov {t.min_coverage:.2f}, agr {t.min_agreement:.2f})": t
        for t, names in labels.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}")
    examples = [e for e in load_examples() if e.split in ("val", "test")]
    vectors, model_id = asyncio.run(embed([e.text for e in examples]))
    graded = asyncio.run(grade_all(examples, vectors))
    val_rows = [i for i, g in enumerate(graded) if g.example.split == "val"]
    val = [graded[i] for i in val_rows]
    test_rows = [i for i, g in enumerate(graded) if g.example.split == "test"]
    test = [graded[i] for i in test_rows]
    best, feasible = tune(val)
    chosen = compared(best)
    for t in chosen.values():
        check_against_grade(graded, t)
    print(
        f"\nVAL part of the dev split; criterion: max multihop escalation s.t. lookup-in "
        f"escalation <= {MAX_LOOKUP_ESCALATION:.0%}"
    )
    print_separability(val)
    print_val_routing(val, vectors[val_rows], model_id)
    print(f"grid {GRID[0]}..{GRID[-1]} step 0.05 on both; best feasible points:")
    for multihop_rate, lookup_rate, t in feasible[:5]:
        print(
            f"  coverage {t.min_coverage:.2f} agreement {t.min_agreement:.2f}: multihop "
            f"{multihop_rate:.3f}, lookup-in {lookup_rate:.3f}"
        )
    for label, t in chosen.items():
        print(describe(val, t, label))
    print_test_report(args, test, vectors[test_rows], model_id, chosen)


if __name__ == "__main__":
    main()
