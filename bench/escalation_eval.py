"""Escalation: does grading the lookup's evidence, and escalating what it finds thin, catch the
multihop questions the classifier sends to lookup, without escalating answerable lookups?

    python bench/escalation_eval.py [route_eval's price and token options]
    python bench/escalation_eval.py --final-test   # once, at the end: the FanOutQA test file
    python bench/escalation_eval.py --rerank local # the lookup's rerank stage on

Every question of the dev split made by `scripts/train_router.py` (val and test parts) runs the
lookup path's real retrieval: the embedded index over the 10,033 Wikipedia lead sections built by
`bench/retrieval_eval.py`, k and candidates from `RetrievalConfig`, arm weights from the route
policy (identifiers raise the lexical weight), through `routers.lookup.gather_evidence` itself.
`--rerank local` puts the local cross-encoder behind the shipped rerank policy in its stage, as
`retrieval.rerank.reranker: local` does, so every grade reads the reranked hits the answer would
cite (its timeout raised to the maximum: a bench run's figures must not depend on the machine's
load; a failed rerank stops the run); the ACME check stays on fused evidence.
Two grading methods (`routers.grading.assess`):
- signals: coverage of the question's content words and agreement of the two arms, two
  thresholds tuned here on val;
- learned: `routers.sufficiency`'s model, fitted on the tuning part (train+val) with its
  threshold chosen out of fold jointly with the router's multihop margin by
  `scripts/train_sufficiency.py` (read from its artifact).

Populations:
- lookup-in: leaf sub-questions whose evidence page is in the corpus: should NOT escalate;
- lookup-out: leaf sub-questions whose page is not in the corpus (escalating them is defensible:
  the corpus cannot answer them), reported apart;
- multihop: parent questions: SHOULD end on the multihop route.

Criterion for the signals thresholds, fixed before looking at test: on val, maximise the multihop
escalation rate subject to at most 10% lookup-in escalation; ties go to the lower lookup-in rate,
then to less escalation. Test (held out from both trainings and from tuning) compares (a) the
learned classifier alone, (b) + signals escalation, (c) + learned escalation on multihop recall
(a multihop question ends on the multihop route: classified multihop, or sent to lookup and
escalated), the share of lookup-in questions escalated, and the share of single-hop questions
flagged multihop by the classifier or escalation together (lookup-in; and every single-hop one,
lookup-out included), with 95% bootstrap intervals resampling parents (seeded), the gain of each
over (a) paired on the same resamples, the AUC of each score, and route accuracy and cost beside
`bench/route_eval.py`'s baselines (an escalated question costs a multihop answer; the retrieval
before the grade is not priced). The FanOutQA test file is read only by `--final-test`.

Style-shifted: the held-out set of `scripts/generate_router_data.py` (other templates, other
entities of the same Wikipedia sample) through the same lookup path: multihop recall and the
share of lookup and direct questions flagged, classifier alone and with the learned escalation.

Out of domain: the learned grade, at its threshold, over hand-written single-hop and two-document
questions on the suite's support corpus (tests/data/acme, ingested into a fresh embedded index):
a model that reads the corpus's scale, not the evidence, escalates the single-hop ones there.

`--final-test` reports only the FanOutQA test file (questions only, all multi-hop) through the
shipped classifier and learned escalation: multihop recall, each alone and together. Run it once,
when nothing is tuned any more; nothing is tuned after reading it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.rerank.local import LocalCrossEncoder  # noqa: E402
from backends.retrieval.base import Hit, Retriever, Vector  # noqa: E402
from backends.retrieval.embedded import EmbeddedRetriever  # noqa: E402
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
    bootstrap,
    parse_args,
    print_table,
    route_costs,
)
from gateway.ingest.pipeline import ingest_documents  # noqa: E402
from gateway.ingest.readers import read_paths  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.settings import RetrievalConfig  # noqa: E402
from routers.grading import (  # noqa: E402
    EvidenceGrade,
    GradeThresholds,
    assess,
    best_possible_score,
    grade,
)
from routers.learned import CLASSES, LearnedClassifier  # noqa: E402
from routers.lookup import LookupParams, gather_evidence  # noqa: E402
from routers.policy import PolicyConfig, decide  # noqa: E402
from routers.rerank import (  # noqa: E402
    RERANK_OFF,
    RerankConfig,
    RerankRecorder,
    RerankStage,
    RerankTrace,
)
from routers.rules import EscalationConfig  # noqa: E402
from routers.sufficiency import SufficiencyModel, use_model  # noqa: E402
from routers.types import Classification, Route, RouteContext  # noqa: E402
from scripts.train_router import (  # noqa: E402
    Example,
    fanoutqa_path,
    labels_of,
    load_examples,
    style_shift_examples,
)

MAX_LOOKUP_ESCALATION = 0.10
GRID = tuple(round(x, 2) for x in np.arange(0.0, 1.0001, 0.05))
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
BOOTSTRAP_NOTE = "95% bootstrap resampling parents (route_eval's seed), gains paired"
LOOKUP, MULTIHOP = CLASSES.index(Route.LOOKUP), CLASSES.index(Route.MULTIHOP)
RERANK_TIMEOUT_S = 30.0  # the configuration's maximum
RERANKERS = ("off", "local")

# Out of domain: the suite's support corpus, two short documents unlike Wikipedia leads, with
# questions written by hand before any model was fitted to them. Each single-hop question is
# answered by one passage; each multi-hop one needs a fact from errors.md AND one from
# warranty.txt. Escalating a single-hop one sends an ordinary lookup to an agent costing 3-10x.
ACME_DIR = REPO / "tests" / "data" / "acme"
ACME_SINGLE_HOP = (
    "How do I fix ERR-4471?",
    "How do I fix ERR-4471 on the Acme router?",
    "How long does Acme take to ship a replacement?",
    "What does the Acme warranty exclude?",
    "What causes ERR-5120?",
    "What should I do about a configuration checksum mismatch on my router?",
    "How long is the warranty on an Acme router?",
    "Where is the serial number printed on an Acme router?",
    "How soon does ERR-4471 clear after running acme-cli reload?",
    "Does the Acme warranty cover hardware faults?",
)
ACME_MULTI_HOP = (
    "My router shows ERR-4471 after a power surge; would the warranty cover a repair?",
    "If I open the case to fix ERR-5120, is my Acme router still under warranty?",
    "What command clears ERR-4471, and how many business days does a replacement unit take?",
    "Which error code means a configuration checksum mismatch, and how many years of warranty "
    "does the router that reports it carry?",
    "ERR-5120 says a file does not match the manifest; what do I need to claim a warranty "
    "replacement if restoring the backup fails?",
)


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
    retriever: Retriever,
    example: Example,
    vector: Vector,
    population: str,
    rerank: RerankStage = RERANK_OFF,
    decisions: RerankRecorder | None = None,
) -> Graded:
    """The lookup route's evidence through `routers.lookup.gather_evidence` itself (the search,
    then `rerank`'s stage: the hits the gateway grades and cites), and its grade signals."""
    config = RetrievalConfig()
    policy = PolicyConfig(
        tenant=TENANT,
        allow_force_route=False,
        lexical_weight=config.lexical_weight,
        dense_weight=config.dense_weight,
        identifier_lexical_weight=config.identifier_lexical_weight,
        executable=frozenset(Route),
    )
    decision = decide(Classification(Route.LOOKUP, 1.0), "auto", example.text, policy)
    ctx = RouteContext(TENANT, example.text, vector, (), decision, reranks=decisions)
    # No grading: the evidence comes back whatever it holds; the bench grades it below.
    params = LookupParams(k=config.k, candidates=config.candidates, grading=None)
    evidence = await gather_evidence(ctx, retriever, params, rerank)
    hits = evidence if isinstance(evidence, list) else []  # an Answer: the search found nothing
    best = best_possible_score(decision.lexical_weight, decision.dense_weight)
    # Zero thresholds: every grade is "sufficient", so this reads the two signals only.
    signals = grade(example.text, hits, GradeThresholds(0.0, 0.0), best)
    return Graded(example, population, hits, best, signals.coverage, signals.agreement)


class Decisions:
    """The rerank stage's recorder for a bench run: its decisions counted. A failed rerank
    stops the run: a fused order scored as a reranked one would measure nothing."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record(self, trace: RerankTrace) -> None:
        if trace.decision == "failed":
            raise SystemExit(f"rerank failed: {trace.detail}")
        self.counts[trace.decision] += 1

    def spend(self, usd: float) -> None:
        return None


def rerank_stage(reranker: str) -> tuple[RerankStage, LocalCrossEncoder | None]:
    """The lookup's rerank stage for `--rerank`: off, or the local cross-encoder behind the
    shipped policy (`RerankConfig`'s defaults, as `retrieval.rerank.reranker: local` builds it)
    with the longest timeout: here it bounds nothing, and on a shared machine it would turn
    load into failed reranks."""
    if reranker == "off":
        return RERANK_OFF, None
    model = LocalCrossEncoder()
    config = RerankConfig(reranker="local", timeout_s=RERANK_TIMEOUT_S)
    return RerankStage(config, model), model


def escalates(item: Graded, thresholds: GradeThresholds) -> bool:
    """What `gather_evidence` decides for these thresholds (checked against grade() in main)."""
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


def signal_escalations(items: Sequence[Graded], thresholds: GradeThresholds) -> Bools:
    return np.array([escalates(i, thresholds) for i in items], dtype=bool)


def describe(items: Sequence[Graded], escalated: Bools, label: str) -> str:
    parts = []
    for name in ("lookup-in", "lookup-out", "multihop", "direct"):
        rows = np.array([i.population == name for i in items])
        share = escalated[rows].mean() if rows.any() else float("nan")
        parts.append(f"{name} {share:.3f} (n={rows.sum()})")
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
        f"learned sends {missed} of {len(multihop)} val multihop questions to lookup (its "
        "multihop margin leaves many to escalation), so tuning uses all of them"
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


def with_escalation(pred: I64, escalated: Bools) -> I64:
    """A classifier's routes after the lookup path escalates what its grade finds thin."""
    return np.where((pred == LOOKUP) & escalated, MULTIHOP, pred).astype(np.int64)


def learned_grades(
    items: Sequence[Graded], classifications: Sequence[Classification]
) -> tuple[F64, Bools]:
    """P(insufficient) and the escalation decision of `assess` with the learned method at the
    artifact's threshold; a lookup without hits escalates whatever the method (P read as 1)."""
    config = EscalationConfig(method="learned")
    grades = [
        assess(g.example.text, g.hits, c, g.best_possible, config)
        for g, c in zip(items, classifications, strict=True)
    ]
    probability = np.array([1.0 if g.probability is None else g.probability for g in grades])
    return probability, np.array([not g.sufficient for g in grades], dtype=bool)


def _mean(_: I64, pred: I64) -> float:
    return float(pred.mean())


def _gain(base: I64, pred: I64) -> float:
    return float((pred - base).mean())


def _with_interval(
    groups: Sequence[str], base: I64, pred: I64, statistic: Callable[[I64, I64], float]
) -> str:
    low, high = bootstrap(groups, base, pred, statistic)
    return f"{statistic(base, pred):.3f} [{low:.3f},{high:.3f}]"


def print_escalation_table(items: Sequence[Graded], policies: dict[str, I64]) -> None:
    """Per policy: multihop recall, its gain over the first policy (paired: the same resampled
    parents), and the share of lookup-in / lookup-out questions escalated."""
    population = np.array([g.population for g in items])
    groups = np.array([g.example.group for g in items])
    base = next(iter(policies.values()))
    print(
        f"  {'policy':<30}{'multihop recall [95% CI]':>26}{'gain vs (a) [95% CI]':>26}"
        f"{'lookup-in escalated':>26}{'lookup-out esc.':>17}"
        f"{'lookup-in flagged':>26}{'all single-hop flagged':>26}"
    )
    single_hop = (population == "lookup-in") | (population == "lookup-out")
    for name, pred in policies.items():
        on_multihop = (pred == MULTIHOP).astype(np.int64)
        escalated = ((base == LOOKUP) & (pred == MULTIHOP)).astype(np.int64)
        cells = []
        for rows, before, after, statistic in (
            (population == "multihop", on_multihop, on_multihop, _mean),
            (population == "multihop", (base == MULTIHOP).astype(np.int64), on_multihop, _gain),
            (population == "lookup-in", escalated, escalated, _mean),
            (population == "lookup-in", on_multihop, on_multihop, _mean),
            (single_hop, on_multihop, on_multihop, _mean),
        ):
            cells.append(_with_interval(list(groups[rows]), before[rows], after[rows], statistic))
        out = escalated[population == "lookup-out"].mean()
        print(
            f"  {name:<30}"
            + "".join(f"{c:>26}" for c in cells[:3])
            + f"{out:>17.3f}"
            + "".join(f"{c:>26}" for c in cells[3:])
        )
    print(
        "  flagged = ends on the multihop route, by the classifier or by escalation (the target: "
        "multihop recall >= 0.95 with <= 5% of single-hop questions flagged)"
    )
    counts = {p: int((population == p).sum()) for p in ("multihop", "lookup-in", "lookup-out")}
    print(f"  n = {counts}; intervals: {BOOTSTRAP_NOTE}")
    print(
        "  a share of 0 has the degenerate interval [0,0]; its 95% upper bound is about 3/n "
        f"(rule of three): {3 / counts['lookup-in']:.3f} for lookup-in"
    )


def print_auc(items: Sequence[Graded], scores: dict[str, F64]) -> None:
    """Each score's AUC for flagging multihop against lookup-in (higher flags)."""
    population = np.array([g.population for g in items])
    positive, negative = population == "multihop", population == "lookup-in"
    print("AUC, multihop against lookup-in (0.5 = chance):")
    for name, score in scores.items():
        print(f"  {name:<42}{auc(-score[positive], -score[negative]):.3f}")


async def acme_grades(
    config: EscalationConfig, workdir: Path
) -> dict[str, list[tuple[str, EvidenceGrade]]]:
    """Every ACME question's grade under `config`, through the lookup route's real retrieval
    over tests/data/acme ingested into a fresh embedded index in `workdir`, with the shipped
    router's classification: the out-of-domain check of the bench and of the unit tests."""
    embedder = MiniLMEmbedder()
    retriever = EmbeddedRetriever(workdir / "acme.sqlite3")
    try:
        use_model(embedder.model_id)
        await ingest_documents(TENANT, read_paths([ACME_DIR]), embedder, retriever)
        classifier = LearnedClassifier.load(embedding_model_id=embedder.model_id)
        out: dict[str, list[tuple[str, EvidenceGrade]]] = {}
        for name, questions in (("single-hop", ACME_SINGLE_HOP), ("multi-hop", ACME_MULTI_HOP)):
            vectors = await embedder.embed(questions)
            out[name] = []
            for question, vector in zip(questions, vectors, strict=True):
                example = Example(question, Route.LOOKUP, "acme", "acme")
                item = await run_lookup(retriever, example, vector, name)
                verdict = classifier.classify(question, vector)
                out[name].append(
                    (question, assess(question, item.hits, verdict, item.best_possible, config))
                )
        return out
    finally:
        await retriever.aclose()
        await embedder.aclose()


def print_style_report(reranker: str) -> None:
    """The style-shifted held-out set through the classifier and the lookup path's grade."""
    style = style_shift_examples()
    print_routes_report(
        f"STYLE-SHIFTED held-out set ({len(style)} questions, other templates and entities; "
        "each its own bootstrap group)",
        style,
        reranker,
    )


def print_final_test_report(reranker: str) -> None:
    """FanOutQA test (questions only, all multi-hop), once, untuned: the shipped classifier and
    escalation. Its evidence pages were never checked against the corpus, so a question the
    corpus cannot answer may escalate for that reason alone, as on the dev split's lookup-out."""
    questions = json.loads(fanoutqa_path("fanout-final-test.json").read_text("utf-8"))
    examples = [Example(q["question"], Route.MULTIHOP, q["question"], "final") for q in questions]
    print_routes_report(
        f"FanOutQA TEST ({len(examples)} questions, reserved split, untuned; each its own "
        "bootstrap group)",
        examples,
        reranker,
    )


def print_routes_report(title: str, examples: Sequence[Example], reranker: str) -> None:
    """Share of each label ending on the multihop route, classifier alone and with the lookup
    path's learned escalation."""
    vectors, model_id = asyncio.run(embed([e.text for e in examples]))
    items = asyncio.run(grade_all(examples, vectors, reranker))
    use_model(model_id)  # the learned grade's artifact, for this embedder
    classifier = LearnedClassifier.load(embedding_model_id=model_id)
    classifications = [
        classifier.classify(e.text, v) for e, v in zip(examples, vectors, strict=True)
    ]
    alone = np.array([CLASSES.index(c.route) for c in classifications], dtype=np.int64)
    combined = with_escalation(alone, learned_grades(items, classifications)[1])
    y = labels_of(examples)
    print(f"\n{title}: share ending on the multihop route")
    print(f"  {'':<26}{'classifier alone':>24}{'+ learned escalation':>24}")
    for label, route in (
        ("multihop (recall)", Route.MULTIHOP),
        ("lookup (flagged)", Route.LOOKUP),
        ("direct (flagged)", Route.DIRECT),
    ):
        rows = y == CLASSES.index(route)
        if not rows.any():
            continue
        groups = [e.text for e, r in zip(examples, rows, strict=True) if r]
        cells = [
            _with_interval(groups, flags[rows], flags[rows], _mean)
            for flags in (
                (alone == MULTIHOP).astype(np.int64),
                (combined == MULTIHOP).astype(np.int64),
            )
        ]
        print(f"  {label:<26}" + "".join(f"{c:>24}" for c in cells) + f"   (n={int(rows.sum())})")


def print_acme_report() -> None:
    """Escalation rates of the learned grade on the out-of-domain ACME questions."""
    with tempfile.TemporaryDirectory() as workdir:
        grades = asyncio.run(acme_grades(EscalationConfig(method="learned"), Path(workdir)))
    print(
        "\nOUT OF DOMAIN: tests/data/acme, hand-written questions, learned grade at its threshold"
    )
    for name, rows in grades.items():
        escalated = sum(not g.sufficient for _, g in rows)
        print(f"  {name}: {escalated} of {len(rows)} escalated")
        for question, g in rows:
            mark = "ESCALATED" if not g.sufficient else "sufficient"
            p = 1.0 if g.probability is None else g.probability  # no hits
            print(f"    P={p:.3f} {mark:<10} {question}")


def print_test_report(
    args: argparse.Namespace,
    test: Sequence[Graded],
    vectors: Vector,
    model_id: str,
    signals_thresholds: GradeThresholds,
    model: SufficiencyModel,
) -> None:
    examples = [g.example for g in test]
    y = labels_of(examples)
    preds, _ = baseline_predictions([e.text for e in examples], vectors, y, model_id)
    classifier = LearnedClassifier.load(embedding_model_id=model_id)
    classifications = [
        classifier.classify(e.text, v) for e, v in zip(examples, vectors, strict=True)
    ]
    probability, learned_escalated = learned_grades(test, classifications)
    signals_escalated = signal_escalations(test, signals_thresholds)
    with_signals = with_escalation(preds["learned"], signals_escalated)
    with_learned = with_escalation(preds["learned"], learned_escalated)
    t = signals_thresholds
    policies = {
        "(a) classifier alone": preds["learned"],
        f"(b) + signals {t.min_coverage:g}/{t.min_agreement:g}": with_signals,
        f"(c) + learned p>{model.threshold:g}": with_learned,
    }
    print("\nTEST part of the dev split: the learned classifier, with and without escalation")
    print_escalation_table(test, policies)
    print("\nescalation rates by population if every question reached the lookup route:")
    print(describe(test, signals_escalated, "signals"))
    print(describe(test, learned_escalated, "learned"))
    print()
    print_auc(
        test,
        {
            "learned P(insufficient)": probability,
            **{name: -np.array([f(g) for g in test]) for name, f in SIGNALS.items()},
        },
    )
    oracle = preds.pop("oracle")
    preds["lrn+signals"], preds["lrn+learned"] = with_signals, with_learned
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


async def grade_all(
    examples: Sequence[Example], vectors: Vector, reranker: str = "off"
) -> list[Graded]:
    """Every example through the lookup path, with `reranker`'s stage (see `rerank_stage`)."""
    docs = load_wiki_sample()
    corpus = {d.doc_id for d in docs}
    pages = evidence_pages()
    embedder = open_embedder()
    retriever = open_embedded()
    rerank, model = rerank_stage(reranker)
    decisions = Decisions()
    try:
        print(await ensure_corpus("embedded", retriever, docs, embedder))
        graded = [
            await run_lookup(retriever, e, v, population(e, pages, corpus), rerank, decisions)
            for e, v in zip(examples, vectors, strict=True)
        ]
    finally:
        await retriever.aclose()
        await embedder.aclose()
        if model is not None:
            await model.aclose()
    print(f"rerank stage ({reranker}): {dict(sorted(decisions.counts.items()))}")
    return graded


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
    rerank = argparse.ArgumentParser(add_help=False)
    rerank.add_argument("--rerank", choices=RERANKERS, default="off")
    known, rest = rerank.parse_known_args(argv)
    args = parse_args(rest)
    print(f"command: python {' '.join(sys.argv)}")
    if args.final_test:
        print_final_test_report(known.rerank)
        return
    examples = [e for e in load_examples() if e.split in ("val", "test")]
    vectors, model_id = asyncio.run(embed([e.text for e in examples]))
    graded = asyncio.run(grade_all(examples, vectors, known.rerank))
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
        print(describe(val, signal_escalations(val, t), label))
    model = use_model(model_id)
    tuned = model.training["metrics"]
    print(
        f"learned: threshold {model.threshold:g} at router margin "
        f"{tuned['router_multihop_margin']:g}; out of fold on train+val, flagged multihop:"
    )
    print(f"  {json.dumps(tuned['out_of_fold_flagged_multihop'])}")
    print_test_report(args, test, vectors[test_rows], model_id, best, model)
    print_style_report(known.rerank)
    print_acme_report()


if __name__ == "__main__":
    main()
