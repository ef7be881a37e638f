"""Fused vs fused + local rerank: quality (R@1, MRR@10) and CPU cost, tuning split first.

    nice -n 10 python bench/rerank_eval.py tuning    # every cell of the grid below
    nice -n 10 python bench/rerank_eval.py held-out --candidates 10 --cut 64 --margin 0.1 \
        --blend 1.0 --skip-lexical --title-weight 0.5 --full-match 4 \
        [--opensearch-url URL --opensearch-alias ALIAS]

Candidates: bench/rerank_candidates.py (the Wikipedia sample on the embedded index, and on each
`--opensearch-url` node behind `--opensearch-alias`; hybrid, the gateway's default fusion and
per-query weights, 50 deep). Metrics are document level as in
bench/retrieval_eval.py: a page's rank is that of its best chunk; R@1 is the share of queries
whose page ranks first, MRR@10 the mean of 1/rank (0 below 10). Reranking re-orders the top
`candidates` chunks by `LocalCrossEncoder` score and leaves the rest in fused order. A policy
reranks a query only when the fused margin, (s1 - s2) / s1 over the two best pages' fused
scores, is at most `margin`, the rerank stage's own rule (1.01 = always, `NEVER` = never).
Intervals: 95% bootstrap resampling whole groups (FanOutQA parent question, lexical and style
page); differences are paired.

`tuning` reads the calibration fold of the tuning split (the groups the reranker was not
trained on, bench/rerank_candidates.py) of the three benchmarks, on the embedded
index, scores each query's top `--depth` candidates once per cut in `--cuts`, prints every
(candidates, cut, margin, blend, keyword skip, title weight, guard) cell, then the CPU cost per
query on one onnxruntime thread for 10/20/50 candidates x cuts 64/128/256. `held-out` reads
the held-out split of the three benchmarks (the style benchmark's: its last part) once per
backend, for the policy given, and
prints fused, always-rerank and the policy with intervals, then whether the policy is below
fusion alone anywhere (a negative mean paired difference in R@1 or MRR@10). The held-out splits
are never used to choose anything; nor is a backend: the policy is the one chosen on the
embedded calibration fold.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from backends.rerank.graph import DELTA_PATH  # noqa: E402
from backends.rerank.local import LocalCrossEncoder  # noqa: E402
from bench.rerank_candidates import (  # noqa: E402
    BENCHMARKS,
    EMBEDDED,
    RERANK_CACHE,
    Listed,
    OpenSearchSource,
    in_training_fold,
    list_name,
    load_split,
)
from bench.retrieval_eval import OPENSEARCH_ALIAS, interval  # noqa: E402
from routers.policy import lexical_reason  # noqa: E402
from routers.rerank import (  # noqa: E402
    final_order,
    full_match_first,
    fused_margin,
    title_matches,
)
from routers.titles import base_name  # noqa: E402

CANDIDATE_COUNTS = (10, 20, 50)
CUTS = (64, 128, 256)
NEVER = -1.0  # a margin no query is under: nothing reranked
MARGINS = (NEVER, 0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.01)  # 1.01: every query (margins are <= 1)
BLENDS = (0.0, 0.5, 1.0, 2.0)
TITLE_WEIGHTS = (0.0, 0.25, 0.5, 1.0)
FULL_MATCH = (0, 1, 3, 4, 5)  # the coverage guard off (0), then its minimum number of words
COST_QUERIES = 6  # queries timed per (candidates, cut) cell
DEPTH = 10


@dataclass(frozen=True, slots=True)
class Policy:
    candidates: int
    cut: int
    margin: float  # rerank when the fused margin is at most this (`NEVER`: never)
    blend: float  # final = minmax(reranker) + blend x minmax(fused), over the candidates
    # Leave keyword and identifier queries (`routers.policy.lexical_reason`) in fused order.
    skip_lexical: bool = False
    # What a candidate whose title the query names adds (`routers.rerank.title_matches`), on
    # reranked queries and, with fused scores alone, on the others, as the rerank stage does.
    title_weight: float = 0.0
    # The coverage guard's `full_match_min_words` (`routers.rerank.full_match_first`); 0: off.
    full_match: int = 0

    def label(self) -> str:
        skip = "skip" if self.skip_lexical else "-"
        return (
            f"{self.candidates:>5}{self.cut:>5}{self.margin:>7.2f}{self.blend:>6.1f}{skip:>6}"
            f"{self.title_weight:>6.2f}{self.full_match:>5}"
        )

    def reranks(self, listed: Listed) -> bool:
        if self.skip_lexical and lexical_reason(listed.query):
            return False
        # The stage's own rule (`RerankStage.decide`): reranked unless the margin is over
        # `max_margin`; a list of one document has no margin and is reranked.
        margin = fused_margin(listed.candidates)  # reads a candidate's doc_id and score
        return margin is None or margin <= self.margin


def page_rank(doc_ids: Sequence[str], page: str) -> int | None:
    for rank, doc_id in enumerate(dict.fromkeys(doc_ids), start=1):
        if doc_id == page:
            return rank if rank <= DEPTH else None
    return None


def _minmax(values: Sequence[float]) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    span = v.max() - v.min()
    return (v - v.min()) / span if span > 0 else np.ones_like(v)


def reranked_docs(listed: Listed, scores: Sequence[float] | None, policy: Policy) -> list[str]:
    """The documents in the policy's order: reranked (`scores`) or, with None, the fused scores
    with the title term alone."""
    head = listed.candidates[: policy.candidates]
    fused = _minmax([c.score for c in head])
    final = fused if scores is None else _minmax(scores[: len(head)]) + policy.blend * fused
    named = title_matches(listed.query, [c.doc_id for c in head])  # the doc id is the title
    order = final_order([float(f) for f in final], named, policy.title_weight)
    if policy.full_match:
        passages = [f"{c.doc_id} {c.text}" for c in head]
        order = full_match_first(listed.query, passages, order, policy.full_match)
    rest = listed.candidates[policy.candidates :]
    return [head[i].doc_id for i in order] + [c.doc_id for c in rest]


def ranks(
    split: list[Listed], scores: list[list[float]] | None, policy: Policy | None
) -> list[int | None]:
    if scores is None:
        return [page_rank([c.doc_id for c in x.candidates], x.page) for x in split]
    pairs = zip(split, scores, strict=True)
    return [page_rank(_ordered_docs(x, s, policy), x.page) for x, s in pairs]


def metrics(r: list[int | None]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    r1 = np.array([x == 1 for x in r], dtype=np.float64)
    rr = np.array([1 / x if x else 0.0 for x in r])
    return r1, rr


def with_interval(values: np.ndarray[Any, Any], groups: list[str], signed: bool = False) -> str:
    low, high = interval(values, groups)
    f = "+.3f" if signed else ".3f"
    return f"{values.mean():{f}} [{low:{f}}, {high:{f}}]"


def score_all(
    encoder: LocalCrossEncoder, split: list[Listed], depth: int, name: str
) -> list[list[float]]:
    """Each query's top `depth` candidates scored, cached by model, split, cut and depth (the
    scores depend on nothing else), so another look at the curves costs no forward pass."""
    path = RERANK_CACHE / f"scores-{encoder.model_id}-{name}-{encoder.cut}-{depth}.json"
    queries = [x.query for x in split]
    if path.exists():
        cached = json.loads(path.read_text("utf-8"))
        if cached["queries"] == queries:
            return list(cached["scores"])
    scores = [encoder.scores_sync(x.query, [c.text for c in x.candidates[:depth]]) for x in split]
    path.write_text(json.dumps({"queries": queries, "scores": scores}), "utf-8")
    return scores


def best_policies(gains: dict[Policy, list[float]], top: int = 8) -> list[str]:
    """The policies whose smallest gain over fusion on any benchmark is largest (the issue's
    rule: never below fusion anywhere), ties by the mean gain, then the cheaper (fewer
    candidates, shorter cut, fewer queries reranked)."""
    ranked = sorted(
        gains.items(),
        key=lambda kv: (
            -min(kv[1]),
            -float(np.mean(kv[1])),
            kv[0].candidates,
            kv[0].cut,
            kv[0].margin,
        ),
    )
    return [
        f"{p.label()}  worst {min(g):+.3f}  mean {np.mean(g):+.3f}  "
        + " ".join(f"{x:+.3f}" for x in g)
        for p, g in ranked[:top]
    ]


def cost_table(splits: dict[str, list[Listed]]) -> list[str]:
    """ms per query on one onnxruntime thread: CPU time of the scoring thread (what the query
    costs a core, whatever else the machine runs) and wall time, median over COST_QUERIES."""
    sample = [x for split in splits.values() for x in split[: COST_QUERIES // len(splits)]]
    lines = [f"{'cut':>5}" + "".join(f"{f'{n} cands cpu/wall ms':>24}" for n in CANDIDATE_COUNTS)]
    for cut in CUTS:
        encoder = LocalCrossEncoder(cut=cut, threads=1)
        encoder.scores_sync("warm up", ["the first call allocates"] * 4)
        cells = []
        for n in CANDIDATE_COUNTS:
            cpu, wall = [], []
            for x in sample:
                start, start_cpu = time.perf_counter(), time.thread_time()
                encoder.scores_sync(x.query, [c.text for c in x.candidates[:n]])
                cpu.append((time.thread_time() - start_cpu) * 1000)
                wall.append((time.perf_counter() - start) * 1000)
            cells.append(f"{np.median(cpu):.0f} / {np.median(wall):.0f}")
        lines.append(f"{cut:>5}" + "".join(f"{c:>24}" for c in cells))
    return lines


def tuning(args: argparse.Namespace) -> None:
    splits = {
        b: [x for x in load_split(b, tuning=True) if not in_training_fold(x.group)][: args.limit]
        for b in BENCHMARKS
    }
    for b, s in splits.items():
        print(f"{b} tuning, calibration fold: {len(s)} queries, {len({x.group for x in s})} groups")
    scores: dict[tuple[str, int], list[list[float]]] = {}
    for cut in args.cuts:
        encoder = LocalCrossEncoder(delta_path=args.delta, cut=cut, threads=args.threads)
        for b, split in splits.items():
            start = time.perf_counter()
            scores[(b, cut)] = score_all(encoder, split, args.depth, f"{b}-calibration")
            print(f"  scored {b} at cut {cut} in {time.perf_counter() - start:.0f} s", flush=True)
    print(
        f"\n{'bench':<10}{'cands':>5}{'cut':>5}{'margin':>7}{'blend':>6}{'lex':>6}{'title':>6}"
        f"{'full':>5}"
        f"{'reranked':>9}"
        f"{'R@1':>7}{'MRR@10':>8}{'dR@1 vs fused [95% CI]':>28}{'dMRR@10':>9}"
    )
    counts = [n for n in CANDIDATE_COUNTS if n <= args.depth]
    gains: dict[Policy, list[float]] = {}
    for b, split in splits.items():
        groups = [x.group for x in split]
        f1, frr = metrics(ranks(split, None, None))
        print(f"{b:<10}{'fused':>50}{f1.mean():>7.3f}{frr.mean():>8.3f}")
        cells = itertools.product(
            counts, args.cuts, MARGINS, BLENDS, (False, True), TITLE_WEIGHTS, FULL_MATCH
        )
        for n, cut, margin, blend, skip, title, full in cells:
            policy = Policy(n, cut, margin, blend, skip, title, full)
            r1, rr = metrics(ranks(split, scores[(b, cut)], policy))
            share = np.mean([policy.reranks(x) for x in split])
            gains.setdefault(policy, []).append(float((r1 - f1).mean()))
            print(
                f"{b:<10}{policy.label()}{share:>9.2f}{r1.mean():>7.3f}{rr.mean():>8.3f}"
                f"{with_interval(r1 - f1, groups, True):>28}{(rr - frr).mean():>+9.3f}"
            )
    print(f"\nbest by the worst benchmark's dR@1, then the mean ({', '.join(splits)}):")
    print("\n".join(best_policies(gains)))
    if args.no_cost:
        return
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nCPU cost per query, one onnxruntime thread (load avg {load}):")
    print("\n".join(cost_table(splits)))


def category(listed: Listed, docs: list[str], candidates: int) -> str:
    """Why the page is not first in `docs` (the module docstring lists the categories)."""
    pages = list(dict.fromkeys(docs))
    if listed.page not in pages:
        return "absent"
    chunk = next(i for i, c in enumerate(listed.candidates) if c.doc_id == listed.page)
    if chunk >= candidates:
        return "beyond the candidates"
    winner = pages[0]
    page_named, winner_named = title_matches(listed.query, [listed.page, winner])
    if page_named and winner_named:
        same = base_name(listed.page) == base_name(winner)
        return "both named, same name" if same else "both named"
    if page_named:
        return "page named, winner not"
    return "winner named, page not" if winner_named else "neither named"


def errors(args: argparse.Namespace) -> None:
    """Every tuning query whose page is not first, fused and under the policy, by category."""
    encoder = LocalCrossEncoder(delta_path=args.delta, cut=args.cut, threads=args.threads)
    plain = Policy(args.candidates, args.cut, args.margin, args.blend, args.skip_lexical)
    titled = policy_of(args)
    for b in BENCHMARKS:
        split = load_split(b, tuning=True)[: args.limit]
        scores = score_all(encoder, split, args.candidates, f"{b}-tuning")
        for name, p in (("fused", None), ("policy", plain), ("policy+titles", titled)):
            counts: dict[str, Counter[str]] = {"training": Counter(), "calibration": Counter()}
            for i, listed in enumerate(split):
                docs = _ordered_docs(listed, scores[i], p)
                if page_rank(docs, listed.page) == 1:
                    continue
                fold = "training" if in_training_fold(listed.group) else "calibration"
                cat = category(listed, docs, args.candidates)
                counts[fold][cat] += 1
                if args.verbose:
                    print(
                        f"  {b} {name} {fold} {cat}: {listed.query!r} page {listed.page!r} "
                        f"first {docs[0]!r}"
                    )
            for fold, c in counts.items():
                n = sum(in_training_fold(x.group) == (fold == "training") for x in split)
                print(
                    f"{b} {name} {fold} ({n} queries): {sum(c.values())} not first: "
                    + ", ".join(f"{k} {v}" for k, v in c.most_common())
                )


def _ordered_docs(listed: Listed, scores: list[float], policy: Policy | None) -> list[str]:
    if policy is not None and policy.reranks(listed):
        return reranked_docs(listed, scores, policy)
    if policy is not None and policy.title_weight > 0:
        return reranked_docs(listed, None, policy)
    return [c.doc_id for c in listed.candidates]


def policy_of(args: argparse.Namespace) -> Policy:
    """The policy the command line names."""
    fields = (args.margin, args.blend, args.skip_lexical, args.title_weight, args.full_match)
    return Policy(args.candidates, args.cut, *fields)


def held_out(args: argparse.Namespace) -> None:
    policy = policy_of(args)
    always = Policy(args.candidates, args.cut, 1.01, args.blend)
    # A negative margin reranks nothing: the fused order with the title term (and the guard).
    titles = Policy(
        args.candidates,
        args.cut,
        NEVER,
        args.blend,
        title_weight=args.title_weight,
        full_match=args.full_match,
    )
    encoder = LocalCrossEncoder(delta_path=args.delta, cut=args.cut, threads=args.threads)
    sources: list[OpenSearchSource | None] = [None]
    sources += [OpenSearchSource(url, args.opensearch_alias) for url in args.opensearch_url]
    print(f"policy (cands cut margin blend lex title full): {policy.label()}")
    print(
        f"{'bench':<10}{'backend':<18}{'variant':<9}{'reranked':>9}{'R@1 [95% CI]':>24}"
        f"{'MRR@10 [95% CI]':>24}{'dR@1 vs fused':>26}{'dMRR@10 vs fused':>26}"
    )
    verdicts = []
    for b, source in itertools.product(BENCHMARKS, sources):
        backend = source.backend if source else EMBEDDED
        split = load_split(b, tuning=False, opensearch=source)[: args.limit]
        groups = [x.group for x in split]
        print(
            f"{b} {backend} held-out: {len(split)} queries, {len(set(groups))} groups", flush=True
        )
        scores = score_all(encoder, split, args.candidates, list_name(backend, b, "held-out"))
        f1, frr = metrics(ranks(split, None, None))
        print(
            f"{b:<10}{backend:<18}{'fused':<9}{0:>9.2f}{with_interval(f1, groups):>24}"
            f"{with_interval(frr, groups):>24}"
        )
        variants: list[tuple[str, Policy]] = [("always", always), ("policy", policy)]
        if args.title_weight > 0:
            variants = [("titles", titles), *variants]
        for name, p in variants:
            r1, rr = metrics(ranks(split, scores, p))
            share = float(np.mean([p.reranks(x) for x in split]))
            print(
                f"{b:<10}{backend:<18}{name:<9}{share:>9.2f}{with_interval(r1, groups):>24}"
                f"{with_interval(rr, groups):>24}{with_interval(r1 - f1, groups, True):>26}"
                f"{with_interval(rr - frr, groups, True):>26}"
            )
        verdicts.append(f"  {b:<10}{backend:<18}{verdict(r1 - f1, rr - frr, groups)}")
    print("\nthe policy against fusion alone (paired, 95% CI by group):")
    print("\n".join(verdicts))


def verdict(d_r1: np.ndarray[Any, Any], d_rr: np.ndarray[Any, Any], groups: list[str]) -> str:
    """Whether the policy's mean paired difference is negative on R@1 or MRR@10, and whether an
    interval lies wholly below 0 (a loss the resampling does not explain away)."""
    # The differences are sums of reciprocals: a tie can come out a rounding error below 0.
    below = [m for m, d in (("R@1", d_r1), ("MRR@10", d_rr)) if round(d.mean(), 9) < 0]
    surely = [m for m, d in (("R@1", d_r1), ("MRR@10", d_rr)) if interval(d, groups)[1] < 0]
    said = f"below fusion on {', '.join(below)}" if below else "not below fusion"
    if surely:
        said += f" (interval below 0 on {', '.join(surely)})"
    return (
        f"dR@1 {with_interval(d_r1, groups, True)}, dMRR@10 {with_interval(d_rr, groups, True)}: "
        f"{said}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("split", choices=("tuning", "held-out", "errors"))
    parser.add_argument("--cuts", type=int, nargs="+", default=[64, 128], help="tuning")
    parser.add_argument("--depth", type=int, default=20, help="tuning: candidates scored")
    parser.add_argument("--candidates", type=int, default=20, help="held-out policy")
    parser.add_argument("--cut", type=int, default=64, help="held-out policy")
    parser.add_argument("--margin", type=float, default=1.01, help="held-out policy")
    parser.add_argument("--blend", type=float, default=0.0, help="held-out policy")
    parser.add_argument("--skip-lexical", action="store_true", help="held-out policy")
    parser.add_argument("--title-weight", type=float, default=0.0, help="held-out policy")
    parser.add_argument("--full-match", type=int, default=0, help="held-out policy; 0: off")
    parser.add_argument(
        "--opensearch-url", action="append", default=[], help="held-out: a node, repeatable"
    )
    parser.add_argument("--opensearch-alias", default=OPENSEARCH_ALIAS, help="held-out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--delta", type=Path, default=DELTA_PATH, help="the reranker's delta")
    parser.add_argument("--no-cost", action="store_true", help="tuning: skip the CPU table")
    parser.add_argument("--verbose", action="store_true", help="errors: every query")
    parser.add_argument("--limit", type=int, default=None, help="at most N queries per bench")
    args = parser.parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}")
    started = time.perf_counter()
    {"tuning": tuning, "held-out": held_out, "errors": errors}[args.split](args)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
