"""An int8 MiniLM encoder against the shipped fp32 one: what it costs the routing and retrieval
benchmarks, and what it saves.

    .venv/bin/python bench/int8_encoder_eval.py                 # the tuning parts: the decision
    .venv/bin/python bench/int8_encoder_eval.py --part heldout  # once, at the end: the report

The int8 graph is `embeddings.precision: int8`'s (`backends.embeddings.int8_graph`, built at
setup: onnxruntime's dynamic quantisation of the fp32 graph, every MatMul's weights to int8 per
output channel, activations quantised per call). Both encoders run through `OnnxMiniLMEmbedder`
(the same tokenizer, batching and pooling), so only the graph differs.

Benchmarks, each computed with fp32 and with int8 embeddings in this one run:
- routing on FanOutQA dev (`scripts/train_router.py`'s split; tuning = its val part, held out =
  its test part; the shipped learned router, trained on fp32 vectors): accuracy and multihop
  recall, groups = parents;
- routing on the style-shifted set (`routers/data/style_shift_eval.jsonl`; held out only, it
  has no tuning part): accuracy;
- what goes direct (`bench/data/direct_routing.jsonl`, the parts of `bench/direct_eval.py`):
  information routed direct, small talk kept direct, through the shipped classifier and policy;
- retrieval on the embedded index, each encoder indexing the 10,033-page sample itself
  (`bench/retrieval_eval.py`'s corpus, benchmarks and splits): recall@10 of the dense arm and of
  the shipped fusion (minmax_peak, the policy's identifier weight 4) on FanOutQA sub-questions,
  on the lexical benchmark and (held out only) on the style benchmark's held-out part
  (`scripts/make_style_benchmark.py`'s last part, descriptions of a page that do not name it;
  readings before 2026-12-08 read its first part, `bench/data/style_queries.jsonl`).

The rule (issue: "an int8 encoder kept only if route accuracy and recall@10 on every benchmark
stay inside their intervals"): int8's figure must fall inside fp32's 95% bootstrap interval on
every row. Each row also shows the paired difference int8 - fp32 with its interval (the same
resampled groups for both). Then the cost: one short question per call (ms, p50) and a batch of
256 sample chunks (texts per CPU-second), the two graphs interleaved round by round, and the
vectors' cosine to fp32's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Before numpy loads OpenBLAS, as bench/retrieval_eval.py: one BLAS thread on 2 shared cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder, Precision  # noqa: E402
from backends.retrieval.embedded import EmbeddedRetriever  # noqa: E402
from bench.direct_eval import route_all  # noqa: E402
from bench.retrieval_eval import (  # noqa: E402
    CACHE_DIR,
    DEPTH,
    CachedEmbedder,
    Candidate,
    ensure_corpus,
    load_lexical,
    load_queries,
    open_embedded,
    ranks_of,
    read_page_queries,
    retrieve_arms,
    split,
)
from bench.route_eval import bootstrap  # noqa: E402
from gateway.ingest.chunker import chunk_document  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from routers.learned import CLASSES, LearnedClassifier  # noqa: E402
from routers.types import Route  # noqa: E402
from scripts.make_style_benchmark import PARTS as STYLE_PARTS  # noqa: E402
from scripts.train_router import Example, labels_of, load_examples, style_shift_examples  # noqa: E402

I64 = npt.NDArray[np.int64]
ENCODERS: tuple[Precision, ...] = ("fp32", "int8")
# The gateway's fusion as shipped: RetrievalConfig's minmax_peak, the policy's identifier
# weight (`identifier_lexical_weight`, 4).
SHIPPED_FUSION = Candidate("minmax_peak +policy x4", "minmax_peak", per_query="policy", raised=4.0)
DIRECT_DATA = REPO / "bench" / "data" / "direct_routing.jsonl"
STYLE_FILE = STYLE_PARTS[-1]  # the style benchmark's held-out part
TIMING_ROUNDS = 7
TIMING_QUERIES = 64
TIMING_BATCH = 256


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of one benchmark: a 0/1 value per question for each encoder, and the
    question's bootstrap group."""

    name: str
    groups: list[str]
    values: dict[str, I64]


def _mean_of_first(a: I64, _: I64) -> float:
    return float(a.mean())


def _difference(a: I64, b: I64) -> float:
    return float(b.mean() - a.mean())


def report(rows: Sequence[Row]) -> bool:
    """Print every row; True when int8 is inside fp32's interval on all of them."""
    print(
        f"\n{'benchmark':<44}{'n':>6}{'fp32 [95% CI]':>24}{'int8':>8}"
        f"{'int8 - fp32 [95% CI]':>28}  inside"
    )
    kept = True
    for row in rows:
        fp32, int8 = row.values["fp32"], row.values["int8"]
        low, high = bootstrap(row.groups, fp32, int8, _mean_of_first)
        d_low, d_high = bootstrap(row.groups, fp32, int8, _difference)
        inside = low <= float(int8.mean()) <= high
        kept &= inside
        diff = _difference(fp32, int8)
        print(
            f"{row.name:<44}{len(fp32):>6}"
            f"{f'{fp32.mean():.3f} [{low:.3f},{high:.3f}]':>24}{int8.mean():>8.3f}"
            f"{f'{diff:+.3f} [{d_low:+.3f},{d_high:+.3f}]':>28}  {'yes' if inside else 'NO'}"
        )
    return kept


def _route_groups(examples: Sequence[Example]) -> list[str]:
    # Direct lines are each their own group: independent hand-written examples.
    return [e.group if e.route is not Route.DIRECT else f"direct:{e.text}" for e in examples]


def routing_rows(encoders: dict[str, OnnxMiniLMEmbedder], part: str) -> list[Row]:
    classifier = LearnedClassifier.load(embedding_model_id=encoders["fp32"].model_id)
    dev = [e for e in load_examples() if e.split == ("val" if part == "tune" else "test")]
    sets = {"route: FanOutQA dev": dev}
    if part == "heldout":
        sets["route: style-shifted"] = style_shift_examples()
    rows = []
    multihop = CLASSES.index(Route.MULTIHOP)
    for label, examples in sets.items():
        y = labels_of(examples)
        texts = [e.text for e in examples]
        correct: dict[str, I64] = {}
        for name, encoder in encoders.items():
            vectors = encoder.embed_sync(texts)
            routes = [classifier.classify(t, v).route for t, v in zip(texts, vectors, strict=True)]
            predicted = np.array([CLASSES.index(r) for r in routes])
            correct[name] = (predicted == y).astype(np.int64)
        groups = _route_groups(examples)
        rows.append(Row(f"{label} accuracy", groups, correct))
        if label.endswith("dev"):
            hop = y == multihop
            rows.append(
                Row(
                    f"{label} multihop recall",
                    [g for g, h in zip(groups, hop, strict=True) if h],
                    {name: values[hop] for name, values in correct.items()},
                )
            )
    return rows


async def direct_rows(encoders: dict[str, OnnxMiniLMEmbedder], part: str) -> list[Row]:
    import json

    with DIRECT_DATA.open(encoding="utf-8") as f:
        data = [r for line in f if (r := json.loads(line))["split"] == part]
    queries = [r["query"] for r in data]
    info = np.array([r["label"] == "information" for r in data])
    direct = {}
    for name, encoder in encoders.items():
        decisions = await route_all(queries, encoder)
        direct[name] = np.array([d.route is Route.DIRECT for d in decisions], dtype=np.int64)
    questions = np.array(queries)
    return [
        Row("direct: information routed direct", list(questions[info]),
            {n: v[info] for n, v in direct.items()}),
        Row("direct: small talk kept direct", list(questions[~info]),
            {n: v[~info] for n, v in direct.items()}),
    ]  # fmt: skip


async def retrieval_rows(encoders: dict[str, OnnxMiniLMEmbedder], part: str) -> list[Row]:
    docs = load_wiki_sample()
    corpus_ids = {d.doc_id for d in docs}
    benchmarks = {
        "FanOutQA": split(load_queries(corpus_ids), part == "tune", None),
        "lexical": split(load_lexical(corpus_ids), part == "tune", None),
    }
    if part == "heldout":  # only the style benchmark's held-out part: the others were read
        benchmarks["style"] = read_page_queries([STYLE_FILE], corpus_ids)
    stores = {
        "fp32": ("embedded", open_embedded(), CACHE_DIR / "embeddings.npz"),
        "int8": ("embedded-int8", EmbeddedRetriever(CACHE_DIR / "wiki-int8.sqlite3"),
                 CACHE_DIR / "embeddings-int8.npz"),
    }  # fmt: skip
    cached = {name: CachedEmbedder(encoders[name], path) for name, (_, _, path) in stores.items()}
    hits: dict[tuple[str, str, str], I64] = {}
    try:
        ingests = [
            ensure_corpus(label, retriever, docs, cached[name])
            for name, (label, retriever, _) in stores.items()
        ]
        for line in await asyncio.gather(*ingests):
            print(line, flush=True)
        for bench, queries in benchmarks.items():
            for name, (_, retriever, _) in stores.items():
                vectors = await cached[name].embed([q.text for q in queries])
                arms, _ = await retrieve_arms(retriever, queries, vectors)
                for variant in ("dense", SHIPPED_FUSION):
                    ranks = ranks_of(arms, queries, variant)
                    key = "dense" if variant == "dense" else "fused"
                    hits[(bench, key, name)] = np.array(
                        [r is not None and r <= DEPTH for r in ranks], dtype=np.int64
                    )
            cached["fp32"].save()
            cached["int8"].save()
    finally:
        for _, retriever, _ in stores.values():
            await retriever.aclose()
    return [
        Row(
            f"retrieval: {bench} {key} R@10",
            [q.parent for q in queries],
            {name: hits[(bench, key, name)] for name in ENCODERS},
        )
        for bench, queries in benchmarks.items()
        for key in ("dense", "fused")
    ]


def cost_report(encoders: dict[str, OnnxMiniLMEmbedder]) -> None:
    """Single-query latency and batch throughput, the two graphs interleaved round by round."""
    docs = load_wiki_sample()[:: 10_033 // (TIMING_BATCH * 2)]
    window = encoders["fp32"].token_window
    chunks = [
        c.embedding_text
        for d in docs
        for c in chunk_document(d.doc_id, d.title, d.text, window=window)
    ]
    chunks = chunks[:TIMING_BATCH]
    questions = [e.text for e in load_examples() if e.split == "val"][:TIMING_QUERIES]
    single: dict[str, list[float]] = {n: [] for n in ENCODERS}
    batch: dict[str, list[float]] = {n: [] for n in ENCODERS}
    for _ in range(TIMING_ROUNDS):
        for name, encoder in encoders.items():
            for question in questions:
                started = time.perf_counter()
                encoder.embed_sync([question])
                single[name].append((time.perf_counter() - started) * 1000)
            cpu = time.process_time()
            encoder.embed_sync(chunks)
            batch[name].append(len(chunks) / (time.process_time() - cpu))
    print(f"\ncost, {TIMING_ROUNDS} interleaved rounds (load avg {os.getloadavg()[0]:.1f}):")
    for name in ENCODERS:
        p50 = statistics.median(single[name])
        print(
            f"  {name}: one question p50 {p50:.2f} ms, "
            f"batch of {len(chunks)} chunks {statistics.median(batch[name]):.0f} texts/CPU-s"
        )

    def ratio(figures: dict[str, list[float]]) -> float:
        return statistics.median(figures["int8"]) / statistics.median(figures["fp32"])

    print(f"  int8 / fp32: one question {ratio(single):.2f}x the time, batch {ratio(batch):.2f}x "
          "the throughput")  # fmt: skip
    a, b = encoders["fp32"].embed_sync(chunks), encoders["int8"].embed_sync(chunks)
    cosine = (a * b).sum(axis=1)
    print(f"  cosine int8 to fp32 over the batch: mean {cosine.mean():.4f}, min {cosine.min():.4f}")


async def evaluate(part: str) -> bool:
    encoders: dict[str, OnnxMiniLMEmbedder] = {
        name: OnnxMiniLMEmbedder(precision=name) for name in ENCODERS
    }
    for name, encoder in encoders.items():
        print(f"{name}: graph from {encoder.graph_source}", flush=True)
    try:
        rows = routing_rows(encoders, part)
        rows += await direct_rows(encoders, part)
        rows += await retrieval_rows(encoders, part)
        print(f"\npart: {part}")
        kept = report(rows)
        cost_report(encoders)
    finally:
        for encoder in encoders.values():
            await encoder.aclose()
    verdict = (
        "inside on every row: int8 may ship" if kept else "outside on a row: int8 does not ship"
    )
    print(f"\nverdict ({part}): {verdict}")
    return kept


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("tune", "heldout"), default="tune")
    args = parser.parse_args(argv)
    asyncio.run(evaluate(args.part))


if __name__ == "__main__":
    main()
