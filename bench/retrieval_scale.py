"""Retrieval latency against corpus size (1k, 10k, 100k chunks), embedded index and OpenSearch.

    flock /tmp/qg-heavy.lock .venv/bin/python bench/retrieval_scale.py \
        [--sizes 1000,10000,100000] [--backends embedded,opensearch] [--url URL ...] \
        [--fusion minmax_peak] [--tenancy index_per_tenant] [--queries 400]

Corpus. The real chunks are the Wikipedia sample's (`load_wiki_sample`, 10,033 lead sections)
as the ingest pipeline makes them: `chunk_document` at the embedder's token window, each chunk's
`embedding_text` embedded once by the gateway's default embedder (MiniLM on onnxruntime) and
cached under `.cache/bench/retrieval_scale/` (git-ignored). A size is the first documents of a
stream holding the real corpus, then copies of it, until it has at least that many chunks.
Copy c > 0 of a document has doc id `<id>~c`, the same title and text, and each chunk vector
plus seeded Gaussian noise (sd `NOISE` per dimension, cosine to its original ~0.98), unit-norm
again, so k-NN never meets exact ties. What that keeps: BM25 posting lists that grow with the
corpus (10 copies, 10x as long), a real distribution of query terms, vectors where real ones are.
What it does not: the vocabulary stops growing past the real corpus (a real 100k corpus would
hold more rare terms and more distinct neighbours); copies make tight clusters of ten, so a
query's nearest neighbours are a few real chunks ten times over, which makes HNSW's job easier
or harder than real data in ways not measured here; and BM25 scores of copies tie.

A second tenant (`OTHER_TENANT`) holds the first `OTHER_SHARE` of each size's documents, so the
tenant filter runs over a store that holds someone else's chunks: in the embedded index it
shares the SQLite file (its own FTS table and vectors, as always); in OpenSearch it has its own
index under `tenancy: index_per_tenant` (the default), or shares the one index under `shared`.

Writes and searches take the production path: the Retriever's own `upsert_documents`, so each
store is the one `querygate ingest` builds. Embedded: a SQLite file per size, kept in the cache
directory. OpenSearch: its staged-then-flipped write indexes every chunk twice, so the index
holds as many deleted documents as live ones until merges reclaim them (the footprint column
says how many remain); searches start once the node's merges are done. Search:
`Retriever.search` with the lookup route's request (hybrid, `RetrievalConfig`'s k and
candidates, the policy's lexical weight, the configured fusion; `minmax_peak` fuses client-side
on both backends, `minmax` server-side on a node with neural-search).

Queries: FanOutQA dev leaf sub-questions whose page is in the sample (bench/retrieval_eval.py)
and bench/data/lexical_queries.jsonl, shuffled with a fixed seed. Each is embedded once per run,
one at a time as a request does (that time is reported apart: it is not retrieval). Every
(backend, size) is warmed up with one pass over the queries at concurrency 8, then each
concurrency runs every query `--rounds` times; latency is the client's wall time per `search`.
Indexes are dropped at the end (a distinct alias per run); embedded files are kept for reuse.

`--recall`: recall@10 of each backend's k-NN arm alone (`mode: dense`, k 10, the lookup's 50
candidates) against exact search, the 10 chunks of the main tenant with the highest cosine to
the query, computed in numpy over every chunk vector of the corpus. The embedded arm is exact
by construction, so its figure checks the measurement; OpenSearch's is what HNSW
(`--hnsw-m`, `--ef-construction`) loses.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast, get_args

# Before numpy loads OpenBLAS: one thread, as the gateway's embedder assumes on 2 shared cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.base import Embedder, token_window  # noqa: E402
from backends.embeddings.bulk import BulkEmbedder  # noqa: E402
from backends.embeddings.config import EmbeddingsConfig, build_embedder  # noqa: E402
from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import (  # noqa: E402
    Chunk,
    Document,
    FusionMethod,
    Retriever,
    SearchRequest,
    Vector,
)
from backends.retrieval.embedded import EmbeddedRetriever  # noqa: E402
from backends.retrieval.opensearch import OpenSearchConfig, OpenSearchRetriever  # noqa: E402
from bench.retrieval_eval import load_queries  # noqa: E402
from gateway.ingest.chunker import DEFAULT_CHUNKING, chunk_document  # noqa: E402
from gateway.ingest.pipeline import content_hash  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.settings import RetrievalConfig  # noqa: E402
from routers.policy import lexical_reason  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench" / "retrieval_scale"
TENANT = "bench-scale"
OTHER_TENANT = "bench-scale-other"
OTHER_SHARE = 0.1  # of each size's documents, stored again for the second tenant
NOISE = 0.01  # sd per dimension of a copy's vector noise: |noise| ~ 0.2, cosine ~ 0.98
SEED = 11
WRITE_BATCH = 1000  # documents per upsert_documents call
WARMUP_CONCURRENCY = 8
RECALL_K = 10
EXACT_BLOCK = 100_000  # chunk vectors per block: 150 MB, and ~0.8 GB of scores for 400 queries
LEXICAL_QUERIES = REPO / "bench" / "data" / "lexical_queries.jsonl"


# -- corpus ----------------------------------------------------------------------------------


async def real_documents(embedder: Embedder) -> list[Document]:
    """The Wikipedia sample as the ingest pipeline writes it: chunked, every chunk embedded."""
    raw = load_wiki_sample()
    window = token_window(embedder)
    chunked = [
        (doc, chunk_document(doc.doc_id, doc.title, doc.text, DEFAULT_CHUNKING, window=window))
        for doc in raw
    ]
    chunked = [(doc, chunks) for doc, chunks in chunked if chunks]
    texts = [c.embedding_text for _, chunks in chunked for c in chunks]
    rows = iter(await cached_vectors(texts, embedder))
    return [
        Document(
            doc.doc_id,
            doc.title,
            content_hash(doc.title, doc.text),
            tuple(Chunk(c.chunk_id, c.text, c.section, next(rows)) for c in chunks),
        )
        for doc, chunks in chunked
    ]


async def cached_vectors(texts: Sequence[str], embedder: Embedder) -> Vector:
    """The texts' vectors, computed once per model and text list, then read from disk."""
    digest = hashlib.sha256(embedder.model_id.encode())
    for text in texts:
        digest.update(text.encode() + b"\x00")
    path = CACHE_DIR / f"chunks-{digest.hexdigest()[:16]}.npy"
    if path.exists():
        return cast(Vector, np.load(path))
    print(f"embedding {len(texts)} chunks (once; cached in {path})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    bulk = BulkEmbedder(embedder) if isinstance(embedder, MiniLMEmbedder) else embedder
    vectors = np.concatenate(
        [await bulk.embed(texts[i : i + 256]) for i in range(0, len(texts), 256)]
    )
    if bulk is not embedder:
        await bulk.aclose()
    print(f"  {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors.astype(np.float32))
    tmp.replace(path)  # never a half-written cache
    return vectors.astype(np.float32)


def copy_of(document: Document, copy: int, rng: np.random.Generator) -> Document:
    """Copy `copy` of a real document: same text, its own ids, each vector moved by noise."""
    if copy == 0:
        return document
    doc_id = f"{document.doc_id}~{copy}"
    noisy = np.stack([c.embedding for c in document.chunks])
    noisy = noisy + rng.normal(0.0, NOISE, noisy.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    chunks = tuple(
        replace(c, chunk_id=doc_id + c.chunk_id[len(document.doc_id) :], embedding=v)
        for c, v in zip(document.chunks, noisy, strict=True)
    )
    return Document(doc_id, document.title, f"{document.content_hash}~{copy}", chunks)


def corpus(real: Sequence[Document], chunks: int) -> list[Document]:
    """The first documents of real, copy 1, copy 2, ... until they hold >= `chunks` chunks."""
    rng = np.random.default_rng(SEED)
    out: list[Document] = []
    total = 0
    copy = 0
    while total < chunks:
        for document in real:
            out.append(copy_of(document, copy, rng))
            total += len(document.chunks)
            if total >= chunks:
                break
        copy += 1
    return out


def n_chunks(documents: Sequence[Document]) -> int:
    return sum(len(d.chunks) for d in documents)


def digest_of(documents: Sequence[Document]) -> str:
    digest = hashlib.sha256(f"{NOISE}\x00{SEED}".encode())
    for document in documents:
        digest.update(f"{document.doc_id}\x00{document.content_hash}\n".encode())
    return digest.hexdigest()[:16]


# -- queries ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queries:
    texts: list[str]
    vectors: Vector
    embed_ms: list[float]  # one per query, embedded alone


def question_texts(corpus_ids: set[str], limit: int) -> list[str]:
    fanout = [q.text for q in load_queries(corpus_ids)]
    with LEXICAL_QUERIES.open(encoding="utf-8") as f:
        lexical = [json.loads(line)["query"] for line in f if line.strip()]
    texts = fanout + lexical
    random.Random(SEED).shuffle(texts)
    return texts[:limit]


async def embed_queries(texts: Sequence[str], embedder: Embedder) -> Queries:
    await embedder.embed(["warm up"])
    vectors: list[Vector] = []
    times: list[float] = []
    for text in texts:
        start = time.perf_counter()
        vectors.append((await embedder.embed([text]))[0])
        times.append((time.perf_counter() - start) * 1000)
    return Queries(list(texts), np.stack(vectors), times)


def lookup_requests(queries: Queries, fusion: FusionMethod) -> list[SearchRequest]:
    """The lookup route's request per query (routers/lookup.py), with the policy's weights."""
    config = RetrievalConfig()
    return [
        SearchRequest(
            tenant=TENANT,
            text=text,
            vector=vector,
            k=config.k,
            candidates=config.candidates,
            lexical_weight=(
                config.identifier_lexical_weight if lexical_reason(text) else config.lexical_weight
            ),
            dense_weight=config.dense_weight,
            fusion=fusion,
        )
        for text, vector in zip(queries.texts, queries.vectors, strict=True)
    ]


# -- measurement -----------------------------------------------------------------------------


async def timed(
    search: Callable[[SearchRequest], Awaitable[object]],
    requests: Sequence[SearchRequest],
    concurrency: int,
) -> tuple[list[float], float]:
    """(latency of each search in ms, wall seconds) with `concurrency` searches in flight."""
    pending = iter(requests)
    latencies: list[float] = []

    async def worker() -> None:
        for request in pending:
            start = time.perf_counter()
            await search(request)
            latencies.append((time.perf_counter() - start) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start


def exact_top(documents: Sequence[Document], queries: Vector, k: int = RECALL_K) -> list[set[str]]:
    """Per query, the chunk ids of the `k` chunks with the highest cosine (all unit vectors)."""
    ids = np.array([c.chunk_id for d in documents for c in d.chunks])
    vectors = [c.embedding for d in documents for c in d.chunks]
    best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_rows = np.zeros((len(queries), 0), dtype=np.int64)
    for start in range(0, len(vectors), EXACT_BLOCK):
        block = np.stack(vectors[start : start + EXACT_BLOCK])
        scores = queries @ block.T  # queries x block
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if scores.shape[1] > k else None
        rows = top if top is not None else np.tile(np.arange(scores.shape[1]), (len(queries), 1))
        best_scores = np.concatenate([best_scores, np.take_along_axis(scores, rows, 1)], axis=1)
        best_rows = np.concatenate([best_rows, rows + start], axis=1)
        keep = np.argsort(-best_scores, axis=1)[:, :k]
        best_scores = np.take_along_axis(best_scores, keep, 1)
        best_rows = np.take_along_axis(best_rows, keep, 1)
    return [set(ids[row].tolist()) for row in best_rows]


async def knn_recall(
    retriever: Retriever, requests: Sequence[SearchRequest], truth: Sequence[set[str]]
) -> float:
    """Mean recall@k of the k-NN arm alone against `truth` (exact search)."""
    found = []
    for request, exact in zip(requests, truth, strict=True):
        hits = await retriever.search(replace(request, mode="dense", k=RECALL_K))
        found.append(len({h.chunk_id for h in hits} & exact) / RECALL_K)
    return float(np.mean(found))


@dataclass(frozen=True, slots=True)
class Row:
    backend: str
    chunks: int
    concurrency: int
    p50: float
    p99: float
    qps: float
    footprint: str
    # p50 of each arm searched alone (mode "bm25", "dense"), at concurrency 1 only
    arms: tuple[float, float] | None = None
    recall: float | None = None  # of the k-NN arm against exact search (--recall), c=1 only


async def measure(
    backend: str,
    retriever: Retriever,
    requests: Sequence[SearchRequest],
    chunks: int,
    footprint: Callable[[], Awaitable[str]],
    rounds: int,
    truth: Sequence[set[str]] | None,
) -> list[Row]:
    await timed(retriever.search, requests, WARMUP_CONCURRENCY)
    size = await footprint()
    rows = []
    for concurrency in (1, 8):
        latencies, wall = await timed(retriever.search, list(requests) * rounds, concurrency)
        p50, p99 = np.percentile(latencies, [50, 99])
        qps = len(latencies) / wall
        arms = await arm_p50s(retriever, requests) if concurrency == 1 else None
        recall = (
            await knn_recall(retriever, requests, truth)
            if truth is not None and concurrency == 1
            else None
        )
        row = Row(backend, chunks, concurrency, float(p50), float(p99), qps, size, arms, recall)
        rows.append(row)
        print(_format(rows[-1]), flush=True)
    return rows


async def arm_p50s(retriever: Retriever, requests: Sequence[SearchRequest]) -> tuple[float, float]:
    """p50 of the BM25 arm alone and of the k-NN arm alone, one search at a time."""
    p50s = []
    for mode in ("bm25", "dense"):
        alone = [replace(r, mode=mode) for r in requests]
        latencies, _ = await timed(retriever.search, alone, 1)
        p50s.append(float(np.percentile(latencies, 50)))
    return p50s[0], p50s[1]


def resident_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


# -- backends --------------------------------------------------------------------------------


async def run_embedded(
    documents: Sequence[Document],
    requests: Sequence[SearchRequest],
    rounds: int,
    truth: Sequence[set[str]] | None,
) -> list[Row]:
    chunks = n_chunks(documents)
    path = CACHE_DIR / f"embedded-{chunks}-{digest_of(documents)}.sqlite3"
    fresh = not path.exists()
    async with EmbeddedRetriever(path) as retriever:
        if fresh:
            start = time.perf_counter()
            await write_all(retriever, documents)
            print(
                f"  embedded {chunks}: written in {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        before = resident_mb()
        await retriever.search(requests[0])  # loads the tenant's vectors

        async def footprint() -> str:
            loaded = resident_mb() - before
            vectors = chunks * requests[0].vector.shape[0] * 4 / 2**20
            file = path.stat().st_size / 2**20
            return f"vectors {vectors:.0f} MB, RSS +{loaded:.0f} MB, file {file:.0f} MB"

        return await measure("embedded", retriever, requests, chunks, footprint, rounds, truth)


async def write_all(retriever: Retriever, documents: Sequence[Document]) -> None:
    other = documents[: int(len(documents) * OTHER_SHARE)]
    for tenant, docs in ((TENANT, documents), (OTHER_TENANT, other)):
        for i in range(0, len(docs), WRITE_BATCH):
            await retriever.upsert_documents(tenant, docs[i : i + WRITE_BATCH])


async def run_opensearch(
    url: str,
    args: argparse.Namespace,
    documents: Sequence[Document],
    requests: Sequence[SearchRequest],
    truth: Sequence[set[str]] | None,
) -> list[Row]:
    chunks = n_chunks(documents)
    alias = f"bench-scale-{uuid.uuid4().hex[:8]}"
    config = OpenSearchConfig.model_validate(
        {
            "hosts": [url],
            "alias": alias,
            "tenancy": args.tenancy,
            "write_timeout_s": 120,
            "hnsw_m": args.hnsw_m,
            "hnsw_ef_construction": args.ef_construction,
        }
    )
    retriever = OpenSearchRetriever(config)
    try:
        start = time.perf_counter()
        index = await load(retriever, documents)
        print(
            f"  opensearch {chunks}: loaded and merged in {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )

        async def footprint() -> str:
            return await index_size(retriever, index)

        label = f"opensearch {await version(retriever)}"
        return await measure(label, retriever, requests, chunks, footprint, args.rounds, truth)
    finally:
        await retriever.drop_all()
        await retriever.aclose()


async def load(retriever: OpenSearchRetriever, documents: Sequence[Document]) -> str:
    """Both tenants' chunks through `upsert_documents`, then the merges the load started;
    returns the main tenant's alias."""
    await write_all(retriever, documents)
    aliases = [retriever.config.tenant_alias(t) for t in (TENANT, OTHER_TENANT)]
    await merges_done(retriever, ",".join(aliases))
    return aliases[0]


def node_client(retriever: OpenSearchRetriever) -> Any:
    """The retriever's own opensearch-py client: the node's stats are read on its connections."""
    return retriever._layout.client


async def merges_done(retriever: OpenSearchRetriever, indices: str, timeout_s: float = 300) -> None:
    """Wait for the merges the load started: they would share the node's CPU with the searches
    (at 100k chunks they ran for most of the first measured pass)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = await node_client(retriever).indices.stats(index=indices, metric="merge")
        if not stats["_all"]["primaries"]["merges"]["current"]:
            return
        await asyncio.sleep(0.5)


async def index_size(retriever: OpenSearchRetriever, index: str) -> str:
    client = node_client(retriever)
    alias = await client.indices.get_alias(name=index)
    name = next(iter(alias))
    stats = await client.indices.stats(index=name, metric="store,segments,docs")
    total = stats["indices"][name]["primaries"]
    store = total["store"]["size_in_bytes"] / 2**20
    deleted = total["docs"]["deleted"]
    nodes = await client.nodes.stats(metric="jvm")
    heap = sum(n["jvm"]["mem"]["heap_used_in_bytes"] for n in nodes["nodes"].values()) / 2**20
    return (
        f"index {store:.0f} MB, {total['segments']['count']} segments, {deleted} deleted docs;"
        f" heap used {heap:.0f} MB"
    )


async def version(retriever: OpenSearchRetriever) -> str:
    info = await node_client(retriever).info()
    return str(info["version"]["number"])


# -- report ----------------------------------------------------------------------------------


HEADER = (
    f"{'backend':18} {'chunks':>7} {'conc':>4} {'p50 ms':>8} {'p99 ms':>8} {'qps':>6}"
    f" {'bm25 p50':>9} {'knn p50':>8} {'knn R@10':>9}  size"
)


def _format(row: Row) -> str:
    arms = f"{row.arms[0]:9.2f} {row.arms[1]:8.2f}" if row.arms else f"{'-':>9} {'-':>8}"
    recall = f"{row.recall:9.3f}" if row.recall is not None else f"{'-':>9}"
    return (
        f"{row.backend:18} {row.chunks:7d} {row.concurrency:4d} {row.p50:8.2f} {row.p99:8.2f}"
        f" {row.qps:6.0f} {arms} {recall}  {row.footprint}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--backends", default="embedded,opensearch")
    parser.add_argument("--url", action="append", help="OpenSearch node (repeatable)")
    parser.add_argument(
        "--fusion", default=RetrievalConfig().fusion, choices=get_args(FusionMethod)
    )
    parser.add_argument(
        "--tenancy", default="index_per_tenant", choices=["index_per_tenant", "shared"]
    )
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=1, help="passes over the queries per run")
    parser.add_argument("--recall", action="store_true", help="k-NN recall@10 against exact")
    parser.add_argument(
        "--hnsw-m", type=int, default=OpenSearchConfig.model_fields["hnsw_m"].default
    )
    parser.add_argument(
        "--ef-construction",
        type=int,
        default=OpenSearchConfig.model_fields["hnsw_ef_construction"].default,
    )
    return parser.parse_args()


async def main() -> None:
    args = parse_args()
    embedder = build_embedder(EmbeddingsConfig())
    try:
        real = await real_documents(embedder)
        texts = question_texts({d.doc_id for d in real}, args.queries)
        queries = await embed_queries(texts, embedder)
    finally:
        await embedder.aclose()
    requests = lookup_requests(queries, args.fusion)
    p50, p99 = np.percentile(queries.embed_ms, [50, 99])
    runtime = getattr(embedder, "runtime", "?")
    print(
        f"{len(texts)} queries; query embedding ({embedder.model_id}, {runtime}, one at a time):"
        f" p50 {p50:.2f} ms, p99 {p99:.2f} ms; fusion {args.fusion}; tenancy {args.tenancy};"
        f" {len(real)} real documents, {n_chunks(real)} real chunks;"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    print(HEADER, flush=True)
    rows: list[Row] = []
    for size in (int(s) for s in args.sizes.split(",")):
        documents = corpus(real, size)
        truth = exact_top(documents, queries.vectors) if args.recall else None
        if "embedded" in args.backends:
            rows += await run_embedded(documents, requests, args.rounds, truth)
        if "opensearch" in args.backends:
            for url in args.url or ["http://127.0.0.1:9200"]:
                rows += await run_opensearch(url, args, documents, requests, truth)
    print("\n" + HEADER)
    for row in rows:
        print(_format(row))


if __name__ == "__main__":
    asyncio.run(main())
