"""What the embedded index's lexical row budget costs the BM25 arm's ranking, on one split.

    python bench/lexical_budget_eval.py [--split tuning|held-out] [--limit N]

Corpus: the 10,033 Wikipedia lead sections, chunked as the gateway chunks them, in an embedded
index under `.cache/bench/lexical_budget/` (built once; a constant vector stands for every
embedding: the BM25 arm never reads vectors). Queries: bench/retrieval_eval.py's two
benchmarks (FanOutQA DEV leaf sub-questions, the lexical set) and its tuning/held-out split.
Each query runs in bm25 mode `CANDIDATES` deep with no budget, with the default budget
(`LEXICAL_ROW_BUDGET`), and with the budget scaled to this corpus as the default is to a
60k-chunk tenant (rows / 6), which is where the pruning acts here. Printed per benchmark and
budget: document-level recall@10 and MRR@10 (with their 95% bootstrap intervals), the share of
queries whose ranking differs from the unbounded one, and the mean search time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
for entry in (REPO, REPO / "bench"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from retrieval_eval import (  # noqa: E402
    CANDIDATES,
    DEPTH,
    Query,
    first_relevant_rank,
    interval,
    load_lexical,
    load_queries,
    mrr_at_k,
    recall_at_k,
    split,
)

from backends.embeddings.base import Vector  # noqa: E402
from backends.retrieval.base import SearchRequest  # noqa: E402
from backends.retrieval.embedded import EmbeddedRetriever, lexical  # noqa: E402
from gateway.ingest.pipeline import ingest_documents  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402

CACHE = REPO / ".cache" / "bench" / "lexical_budget"
TENANT = "bench-wiki"
DIMENSION = 8
SCALE = 60_000  # the default budget's tenant size: rows / SCALE * budget is its share


class ConstantEmbedder:
    """The same unit vector for every text: this bench reads the BM25 arm only."""

    model_id = "constant"
    dimension = DIMENSION

    async def embed(self, texts: Sequence[str]) -> Vector:
        vectors = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        vectors[:, 0] = 1.0
        return vectors

    async def aclose(self) -> None:
        return None


async def ensure_index(path: Path) -> int:
    docs = load_wiki_sample()
    async with EmbeddedRetriever(path) as index:
        if (await index.stats(TENANT))[0] != len(docs):
            await ingest_documents(TENANT, docs, ConstantEmbedder(), index)
        return (await index.stats(TENANT))[1]


async def rankings(
    path: Path, budget: int | None, queries: Sequence[Query]
) -> tuple[list[list[str]], float]:
    """Each query's BM25 ranking (doc ids), and the mean search time in ms."""
    vector = np.zeros(DIMENSION, dtype=np.float32)
    vector[0] = 1.0
    out: list[list[str]] = []
    started = time.perf_counter()
    async with EmbeddedRetriever(path, lexical_row_budget=budget) as index:
        for query in queries:
            request = SearchRequest(
                TENANT, query.text, vector, k=CANDIDATES, mode="bm25", candidates=CANDIDATES
            )
            hits = await index.search(request)
            out.append([h.doc_id for h in hits])
    return out, (time.perf_counter() - started) * 1000 / max(1, len(queries))


def metric_line(ranks: Sequence[int | None], queries: Sequence[Query]) -> str:
    groups = [q.parent for q in queries]
    hit = np.array([r is not None and r <= DEPTH for r in ranks], dtype=np.float64)
    rr = np.array([1 / r if r is not None and r <= DEPTH else 0.0 for r in ranks])
    r_lo, r_hi = interval(hit, groups)
    m_lo, m_hi = interval(rr, groups)
    return (
        f"R@10 {recall_at_k(ranks, DEPTH):.3f} [{r_lo:.3f}, {r_hi:.3f}]  "
        f"MRR@10 {mrr_at_k(ranks):.3f} [{m_lo:.3f}, {m_hi:.3f}]"
    )


async def evaluate(args: argparse.Namespace) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "wiki.sqlite3"
    rows = await ensure_index(path)
    corpus_ids = {d.doc_id for d in load_wiki_sample()}
    tuning = args.split == "tuning"
    benchmarks = {
        "fanoutqa": split(load_queries(corpus_ids), tuning, args.limit),
        "lexical": split(load_lexical(corpus_ids), tuning, args.limit),
    }
    scaled = rows * lexical.LEXICAL_ROW_BUDGET // SCALE
    budgets: list[tuple[str, int | None]] = [
        ("none", None),
        (f"default {lexical.LEXICAL_ROW_BUDGET}", lexical.LEXICAL_ROW_BUDGET),
        (f"scaled {scaled}", scaled),
    ]
    print(f"corpus: {rows} chunks; split: {args.split}")
    for bench, queries in benchmarks.items():
        unbounded: list[list[str]] = []
        for label, budget in budgets:
            ranked, mean_ms = await rankings(path, budget, queries)
            unbounded = unbounded or ranked
            ranks = [first_relevant_rank(r, q.page) for r, q in zip(ranked, queries, strict=True)]
            changed = sum(a != b for a, b in zip(ranked, unbounded, strict=True))
            print(
                f"{bench:>8} n={len(queries):4d} budget {label:>14}: {metric_line(ranks, queries)}"
                f"  ranking changed {changed / max(1, len(queries)):.1%}  {mean_ms:.1f} ms/query",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("tuning", "held-out"), default="tuning")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f} at start")
    asyncio.run(evaluate(args))
    print(f"machine: load avg {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
