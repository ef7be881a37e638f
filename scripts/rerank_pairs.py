"""The reranker's training data: tuning-split queries, their positive passage, hard negatives.

    python scripts/rerank_pairs.py [--out .cache/rerank/pairs.jsonl] [--negatives 7] [--style]

Runs in the gateway's environment (it searches the embedded index); scripts/train_reranker.py
reads its output in the training one. Only the training fold of the TUNING splits is read
(bench/rerank_candidates.py): FanOutQA dev sub-questions and the lexical benchmark (the shipped
delta's data) and, with `--style`, the style benchmark too, each query with the fused candidates
of our own hybrid retrieval. A style query whose page is the page of a held-out query of another
benchmark is left out: the style set is grouped by page, the others by their own groups, and so
adding it gives no held-out page a training row it did not have.

The positive is the best-ranked chunk of the evidence page; the negatives are the best-ranked
chunks of other pages (hard negatives: what fusion put near the top). A query whose page is not
among the candidates is left out: no reranking can bring it back. Rows are sorted by benchmark
and query, so the file, and so the artifact trained on it, is the same on every run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.rerank_candidates import (  # noqa: E402
    BENCHMARKS,
    TRAINED,
    Listed,
    in_training_fold,
    load_split,
)

DEFAULT_OUT = REPO / ".cache" / "rerank" / "pairs.jsonl"


def pair_row(bench: str, listed: Listed, negatives: int) -> dict[str, object] | None:
    positive = next((c for c in listed.candidates if c.doc_id == listed.page), None)
    if positive is None:
        return None
    seen: set[str] = set()
    hard: list[str] = []
    for c in listed.candidates:
        if c.doc_id != listed.page and c.doc_id not in seen and len(hard) < negatives:
            seen.add(c.doc_id)
            hard.append(c.text)
    return {"bench": bench, "query": listed.query, "positive": positive.text, "negatives": hard}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--negatives", type=int, default=7, help="hard negatives per query")
    parser.add_argument("--style", action="store_true", help="the style benchmark's rows too")
    args = parser.parse_args(argv)
    rows = []
    missing = 0
    held_out = (
        {x.page for b in BENCHMARKS for x in load_split(b, tuning=False)} if args.style else set()
    )
    for bench in BENCHMARKS if args.style else TRAINED:
        for listed in load_split(bench, tuning=True):
            if not in_training_fold(listed.group):
                continue
            if bench == "style" and listed.page in held_out:
                continue
            row = pair_row(bench, listed, args.negatives)
            missing += row is None
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (str(r["bench"]), str(r["query"])))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    args.out.write_text(text, "utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()
    print(
        f"{len(rows)} queries ({missing} without their page among the candidates) -> "
        f"{args.out} sha256 {digest}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
