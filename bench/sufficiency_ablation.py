"""Sufficiency grade ablation: what each feature choice does to the operating point, out of fold
on the tuning part only (the dev test part and the FanOutQA test file are never read).

    python bench/sufficiency_ablation.py [--rerank local]   # local: the grade on reranked hits

The figures behind the choices recorded in `routers/sufficiency.py` and docs/benchmarks.md
("The router, measured"). Data and router outputs are `scripts/train_sufficiency.py`'s
(train+val of the dev split, padded twins, each row's router fitted on the other folds); the
shipped router margin.
The criterion is the trainer's: answerable single-hop (lookup-in) questions flagged multihop, by
the router or by escalation, at multihop recall 0.95.

Per variant of the feature rows:
- "fold 0": the trainer's folds, threshold chosen on the same out-of-fold rows (what the
  artifact records: tuned, so optimistic), and the out-of-fold AUC of multihop against
  lookup-in;
- "nested": the threshold chosen on the other folds' out-of-fold rows and applied to the scored
  fold, summed over folds; the mean over the trainer's fold assignment and 4 others
  (`scripts/train_router.py`'s `fold_of` with other salts). The recall it reaches is printed
  beside it (a threshold chosen elsewhere can fall short of 0.95).
- "two bands" (shipped rows only): a router-multihop question whose margin is below a second
  margin M2 is graded too and escalates above its own threshold t2; M2, t2 and the lookup
  threshold chosen together, nested the same way.

Variants: the shipped rows (names_in_top2); names read from the best passage only, possessives
unread; the shipped rows plus a set size ("top 5", "five
tallest") or a plural target ("the teams that") indicator.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.retrieval.base import Hit  # noqa: E402
from bench.escalation_eval import RERANKERS, Graded  # noqa: E402
from routers.learned import CLASSES  # noqa: E402
from routers.sufficiency import _NAME_OR_NUMBER, _TOKEN, SUFFICIENCY_FEATURES  # noqa: E402
from routers.types import Route  # noqa: E402
from scripts.train_router import FOLDS, fold_of, margins  # noqa: E402
from scripts.train_sufficiency import (  # noqa: E402
    POPULATIONS,
    TARGET_RECALL,
    _classification,
    feature_rows,
    fit_sufficiency,
    tuning_data,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
FOLD_SALTS = ("fold", "alt0", "alt1", "alt2", "alt3")  # "fold" is the trainers' own
SECOND_MARGINS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)
SECOND_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
_NUMBER_WORD = r"(?:\d{1,2}|two|three|four|five|six|seven|eight|nine|ten|twelve|twenty)"
_SET_SIZE = re.compile(
    rf"\b(?:top|last|first|the|these|those|all|of)\s+{_NUMBER_WORD}\b"
    rf"|\b{_NUMBER_WORD}\s+(?:\w+\s+)?\w+s\b",
    re.IGNORECASE,
)
_PLURAL_TARGET = re.compile(
    r"\b(?:the|which|what)\s+(?:\w+\s+)?\w{3,}s\s+(?:that|who|which|of|in|from|with|have|has)\b",
    re.IGNORECASE,
)


class Rows:
    """The tuning rows as the trainer builds them, and what every variant shares."""

    def __init__(self, reranker: str) -> None:
        graded, logits, router, _, twins = tuning_data(reranker)
        self.graded: list[Graded] = graded
        self.margin = float(router["decision"]["multihop_margin"])
        self.outputs = [_classification(row, self.margin) for row in logits]
        self.population = np.array([g.population for g in graded])
        self.y = (self.population == "multihop").astype(np.int64)
        self.has_hits = np.array([bool(g.hits) for g in graded])
        self.fit = np.isin(self.population, POPULATIONS) & self.has_hits
        self.question = np.arange(len(graded)) < len(graded) - twins
        others = logits[:, [k for k in range(len(CLASSES)) if CLASSES[k] is not Route.MULTIHOP]]
        self.lookup = np.argmax(others, axis=1) == CLASSES.index(Route.LOOKUP)
        self.router_margin = margins(logits)
        self.fold_sets = [
            np.array([fold_of(g.example, salt) for g in graded], dtype=np.int64)
            for salt in FOLD_SALTS
        ]

    def shipped(self) -> F64:
        return feature_rows(self.graded, self.outputs)

    def probabilities(self, x: F64, folds: I64) -> tuple[F64, float]:
        """Out-of-fold P(insufficient) per question (1 where the lookup found nothing) and the
        out-of-fold AUC of multihop against lookup-in, at the chosen L2."""
        _, p, auc_by_l2 = fit_sufficiency(x, self.y, self.fit, folds)
        return np.where(self.has_hits, p, 1.0)[self.question], max(auc_by_l2.values())


def flags(rows: Rows, p: F64, threshold: float, second: tuple[float, float] | None = None) -> Bools:
    """Ends on the multihop route; with `second` = (M2, t2), a router-multihop question whose
    margin is at most M2 escalates only above t2."""
    m, lookup = rows.router_margin[rows.question], rows.lookup[rows.question]
    by_router = m > (second[0] if second else rows.margin)
    band = (m > rows.margin) & ~by_router
    t2 = second[1] if second else 1.0
    flagged = by_router | (band & (p > t2)) | (~by_router & ~band & lookup & (p > threshold))
    return np.asarray(flagged, dtype=np.bool_)


def choose(
    rows: Rows, p: F64, chosen_on: Bools, seconds: Sequence[tuple[float, float] | None]
) -> tuple[float, tuple[float, float] | None]:
    """The fewest lookup-in flagged among `chosen_on` at TARGET_RECALL (ties: the higher
    threshold), over the candidate thresholds and second bands."""
    population = rows.population[rows.question]
    best: tuple[tuple[float, float], float, tuple[float, float] | None] | None = None
    candidates = np.unique(p[chosen_on])
    for second in seconds:
        for t in [1.0, *((candidates[:-1] + candidates[1:]) / 2)]:
            flagged = flags(rows, p, float(t), second)
            if flagged[chosen_on & (population == "multihop")].mean() < TARGET_RECALL:
                continue
            key = (float(flagged[chosen_on & (population == "lookup-in")].mean()), -float(t))
            if best is None or key < best[0]:
                best = (key, float(t), second)
    if best is None:
        raise SystemExit("no threshold reaches the target recall")
    return best[1], best[2]


def nested(rows: Rows, x: F64, seconds: Sequence[tuple[float, float] | None]) -> list[str]:
    """Per fold assignment: lookup-in flagged and multihop recall, thresholds chosen without the
    scored fold; and the mean over the assignments."""
    population = rows.population[rows.question]
    counts, recalls = [], []
    for folds in rows.fold_sets:
        p, scored_folds = rows.probabilities(x, folds)[0], folds[rows.question]
        flagged = np.zeros(len(p), dtype=np.bool_)
        for f in range(FOLDS):
            threshold, second = choose(rows, p, scored_folds != f, seconds)
            flagged[scored_folds == f] = flags(rows, p, threshold, second)[scored_folds == f]
        counts.append(int(flagged[population == "lookup-in"].sum()))
        recalls.append(float(flagged[population == "multihop"].mean()))
    return [
        f"{' '.join(f'{c:>3}' for c in counts)}",
        f"{np.mean(counts):6.1f}",
        f"{np.mean(recalls):.3f}",
    ]


def tuned(rows: Rows, x: F64) -> str:
    """The trainer's own operating point: fold 0's out-of-fold rows, threshold chosen on them;
    and their AUC."""
    p, auc = rows.probabilities(x, rows.fold_sets[0])
    threshold, _ = choose(rows, p, np.ones(len(p), dtype=np.bool_), [None])
    flagged = flags(rows, p, threshold)
    return f"{int(flagged[rows.population[rows.question] == 'lookup-in'].sum()):>4}  {auc:.3f}"


def _word(token: str) -> str:
    return token.casefold()


def names_in_best(query: str, hits: list[Hit]) -> float:
    """The variant of names_in_top2: names and numbers found in the best passage, as typed."""
    wanted = {_word(w) for w in _NAME_OR_NUMBER.findall(query)}
    if not wanted:
        return 1.0
    best = hits[0]
    found = {_word(w) for w in _TOKEN.findall(f"{best.title} {best.section} {best.text}")}
    return len(wanted & found) / len(wanted)


def with_column(rows: Rows, x: F64, name: str, value: Callable[[Graded], float]) -> F64:
    """`x` with feature `name` replaced by `value`, rows without hits left as they are."""
    out = x.copy()
    column = SUFFICIENCY_FEATURES.index(name)
    for i, g in enumerate(rows.graded):
        if g.hits:
            out[i, column] = value(g)
    return out


def plus_indicator(rows: Rows, x: F64, pattern: re.Pattern[str]) -> F64:
    extra = [
        (1.0 if pattern.search(g.example.text) else 0.0) if g.hits else np.nan for g in rows.graded
    ]
    return np.column_stack([x, np.array(extra)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rerank", choices=RERANKERS, default="off")
    args = parser.parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}")
    rows = Rows(args.rerank)
    shipped = rows.shipped()
    lookup_in = int((rows.population[rows.question] == "lookup-in").sum())
    variants = {
        "shipped (names_in_top2)": shipped,
        "names in the best passage only": with_column(
            rows, shipped, "names_in_top2", lambda g: names_in_best(g.example.text, g.hits)
        ),
        "shipped + set size": plus_indicator(rows, shipped, _SET_SIZE),
        "shipped + plural target": plus_indicator(rows, shipped, _PLURAL_TARGET),
    }
    print(
        f"\nlookup-in questions flagged multihop (of {lookup_in}) at multihop recall "
        f"{TARGET_RECALL}, router margin {rows.margin}; nested per fold assignment "
        f"({', '.join(FOLD_SALTS)}), its mean and the mean recall reached"
    )
    print(f"  {'variant':<34}{'fold 0':>7}  {'AUC':<5}   {'nested':<20}{'mean':>6}  recall")
    for name, x in variants.items():
        per, mean, recall = nested(rows, x, [None])
        print(f"  {name:<34}{tuned(rows, x):>14}   {per:<20}{mean}  {recall}")
    seconds = [None, *((m, t) for m in SECOND_MARGINS for t in SECOND_THRESHOLDS)]
    per, mean, recall = nested(rows, shipped, seconds)
    print(f"  {'shipped, two bands':<34}{'':>14}   {per:<20}{mean}  {recall}")


if __name__ == "__main__":
    main()
