"""The fused candidates the reranker is trained on and evaluated on: one list per query.

Each query of a benchmark split is searched once in hybrid mode, `CANDIDATES` deep, with the
gateway's default fusion and its per-query weights (`routers.policy.lexical_reason` raising the
lexical weight to 4, as `identifier_lexical_weight` does). Benchmarks: bench/retrieval_eval.py's
FanOutQA dev sub-questions and lexical benchmark (`is_tuning` split by group), and the style
benchmark (scripts/make_style_benchmark.py; grouped by page), made in four parts on pages no
other part or benchmark has: its first three parts have been read and are its tuning split, the
fourth (bench/data/style_part4.jsonl) is its held-out split.

Backends: the embedded index of the Wikipedia sample (.cache/bench/retrieval/), and an OpenSearch
node (`load_split(..., opensearch=OpenSearchSource(url, alias))`), into which the sample is
ingested behind that alias, its corpus manifest named by node version and alias, the chunk
embeddings read from the same cache. The lists are cached as JSON under .cache/bench/rerank/
(`candidates-<bench>-<split>.json` for the embedded index,
`candidates-opensearch-<version>-<bench>-<split>.json` for a node; the style benchmark's per
part, `style-part1` to `style-part4`, a split reading its parts' lists), so mining training pairs
(scripts/rerank_pairs.py) and bench/rerank_eval.py read the same ones; only missing lists are
retrieved.

The tuning split is cut once more, by group: the training fold (about 3/4) is what the
reranker learns from, the calibration fold (the rest) is what the policy's curves are measured
on, so that they are not read off queries the model was fitted to.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder
from backends.retrieval.base import Retriever, SearchRequest
from backends.retrieval.opensearch import OpenSearchConfig, OpenSearchRetriever
from bench.retrieval_eval import (
    CACHE_DIR,
    CANDIDATES,
    TENANT,
    CachedEmbedder,
    Query,
    ensure_corpus,
    load_lexical,
    load_queries,
    node_version,
    open_embedded,
    read_page_queries,
    split,
)
from gateway.ingest.wiki_sample import load_wiki_sample
from routers.policy import lexical_reason
from scripts import make_style_benchmark as style_benchmark

RERANK_CACHE = CACHE_DIR.parent / "rerank"
IDENTIFIER_LEXICAL_WEIGHT = 4.0  # the gateway's default `identifier_lexical_weight`
BENCHMARKS = ("fanoutqa", "lexical", "style")
TRAINED = ("fanoutqa", "lexical")  # what the shipped delta learnt from (rerank_pairs.py)
STYLE_PARTS = {f"part{n}": path for n, path in enumerate(style_benchmark.PARTS, start=1)}
# The last part is held out; every earlier one has been read, so it tunes.
STYLE_SPLITS = {"tuning": tuple(STYLE_PARTS)[:-1], "held-out": tuple(STYLE_PARTS)[-1:]}
EMBEDDED = "embedded"


@dataclass(frozen=True, slots=True)
class Candidate:
    chunk_id: str
    doc_id: str
    text: str
    score: float  # the fused score


@dataclass(frozen=True, slots=True)
class Listed:
    """One query, its relevant page and its fused candidates, best first."""

    query: str
    page: str
    group: str
    candidates: list[Candidate]


def in_training_fold(group: str) -> bool:
    """Of the tuning split: trained on (True) or kept for calibrating the policy (False)."""
    return int(hashlib.sha256(f"fold\x00{group}".encode()).hexdigest()[0], 16) >= 4


@dataclass(frozen=True, slots=True)
class OpenSearchSource:
    """A node to retrieve from, and the alias the sample is ingested behind there."""

    url: str
    alias: str

    @property
    def backend(self) -> str:
        return f"opensearch-{node_version(self.url)}"


def list_name(backend: str, bench: str, part: str) -> str:
    """Names a backend's list of one benchmark split (the embedded index's carry no prefix)."""
    return f"{bench}-{part}" if backend == EMBEDDED else f"{backend}-{bench}-{part}"


def _path(backend: str, bench: str, part: str) -> Path:
    return RERANK_CACHE / f"candidates-{list_name(backend, bench, part)}.json"


def load_split(
    bench: str, tuning: bool, opensearch: OpenSearchSource | None = None
) -> list[Listed]:
    """The cached lists of one benchmark split, on the embedded index or `opensearch`,
    retrieved (and cached) when missing."""
    backend = opensearch.backend if opensearch else EMBEDDED
    role = "tuning" if tuning else "held-out"
    parts = STYLE_SPLITS[role] if bench == "style" else (role,)
    paths = [_path(backend, bench, part) for part in parts]
    if not all(path.exists() for path in paths):
        asyncio.run(_retrieve_missing(backend, opensearch))
    listed = []
    for part, path in zip(parts, paths, strict=True):
        rows = json.loads(path.read_text("utf-8"))
        if bench == "style":
            _check_style_cache(path, rows, part)
        listed += [
            Listed(r["query"], r["page"], r["group"], [Candidate(**c) for c in r["candidates"]])
            for r in rows
        ]
    return listed


def _check_style_cache(path: Path, rows: list[dict[str, object]], part: str) -> None:
    """A cached list holding a (query, page) its part's file does not is refused rather than
    read as that part. (A list holds the file's queries whose page is in the corpus, so it may
    hold fewer.)"""
    lines = STYLE_PARTS[part].read_text("utf-8").splitlines()
    wanted = {(json.loads(line)["query"], json.loads(line)["page"]) for line in lines}
    if not {(str(r["query"]), str(r["page"])) for r in rows} <= wanted:
        raise SystemExit(f"{path} is not the style benchmark's {part}: delete it")


def benchmark_parts(bench: str, corpus_ids: set[str]) -> dict[str, list[Query]]:
    """A benchmark's lists to cache by name: tuning and held-out; the style benchmark's
    parts."""
    if bench == "style":
        return {part: read_page_queries([f], corpus_ids) for part, f in STYLE_PARTS.items()}
    queries = load_queries(corpus_ids) if bench == "fanoutqa" else load_lexical(corpus_ids)
    return {"tuning": split(queries, True, None), "held-out": split(queries, False, None)}


def open_retriever(opensearch: OpenSearchSource | None) -> Retriever:
    """The embedded index, or the node's alias."""
    if opensearch is None:
        return open_embedded()
    return OpenSearchRetriever(OpenSearchConfig(hosts=(opensearch.url,), alias=opensearch.alias))


async def _retrieve_missing(backend: str, opensearch: OpenSearchSource | None) -> None:
    docs = load_wiki_sample()
    corpus_ids = {d.doc_id for d in docs}
    embedder = CachedEmbedder(OnnxMiniLMEmbedder(), CACHE_DIR / "embeddings.npz")
    retriever = open_retriever(opensearch)
    label = f"{backend}-{opensearch.alias}" if opensearch else backend
    try:
        print(await ensure_corpus(label, retriever, docs, embedder), flush=True)
        for bench in BENCHMARKS:
            for part, queries in benchmark_parts(bench, corpus_ids).items():
                path = _path(backend, bench, part)
                if path.exists():
                    continue
                listed = await _retrieve(retriever, embedder, queries)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps([asdict(x) for x in listed]) + "\n", "utf-8")
        embedder.save()
    finally:
        await retriever.aclose()
        await embedder.aclose()


async def _retrieve(
    retriever: Retriever, embedder: CachedEmbedder, part: list[Query]
) -> list[Listed]:
    vectors = await embedder.embed([q.text for q in part])
    out = []
    for query, vector in zip(part, vectors, strict=True):
        lexical = IDENTIFIER_LEXICAL_WEIGHT if lexical_reason(query.text) else 1.0
        request = SearchRequest(
            tenant=TENANT,
            text=query.text,
            vector=vector,
            k=CANDIDATES,
            candidates=CANDIDATES,
            lexical_weight=lexical,
        )
        hits = await retriever.search(request)
        listed = [Candidate(h.chunk_id, h.doc_id, h.text, h.score) for h in hits]
        out.append(Listed(query.text, query.page, query.parent, listed))
    return out
