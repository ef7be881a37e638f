"""The fused candidates the reranker is trained on and evaluated on: one list per query.

Each query of a benchmark split (bench/retrieval_eval.py's FanOutQA dev sub-questions and the
lexical benchmark, `is_tuning` split by group) is searched once on the embedded index of the
Wikipedia sample in hybrid mode, `CANDIDATES` deep, with the gateway's default fusion and its
per-query weights (`routers.policy.lexical_reason` raising the lexical weight to 4, as
`identifier_lexical_weight` does). The lists are cached as JSON under .cache/bench/rerank/, so
mining training pairs (scripts/rerank_pairs.py) and bench/rerank_eval.py read the same ones.

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
from bench.retrieval_eval import (
    CACHE_DIR,
    CANDIDATES,
    TENANT,
    CachedEmbedder,
    Query,
    ensure_corpus,
    load_lexical,
    load_queries,
    open_embedded,
    split,
)
from gateway.ingest.wiki_sample import load_wiki_sample
from routers.policy import lexical_reason

RERANK_CACHE = CACHE_DIR.parent / "rerank"
IDENTIFIER_LEXICAL_WEIGHT = 4.0  # the gateway's default `identifier_lexical_weight`
BENCHMARKS = ("fanoutqa", "lexical")


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


def _path(bench: str, split_name: str) -> Path:
    return RERANK_CACHE / f"candidates-{bench}-{split_name}.json"


def load_split(bench: str, tuning: bool) -> list[Listed]:
    """The cached lists of one benchmark split, retrieved (and cached) when missing."""
    path = _path(bench, "tuning" if tuning else "held-out")
    if not path.exists():
        asyncio.run(_retrieve_all())
    rows = json.loads(path.read_text("utf-8"))
    return [
        Listed(r["query"], r["page"], r["group"], [Candidate(**c) for c in r["candidates"]])
        for r in rows
    ]


async def _retrieve_all() -> None:
    docs = load_wiki_sample()
    corpus_ids = {d.doc_id for d in docs}
    queries = {"fanoutqa": load_queries(corpus_ids), "lexical": load_lexical(corpus_ids)}
    embedder = CachedEmbedder(OnnxMiniLMEmbedder(), CACHE_DIR / "embeddings.npz")
    retriever = open_embedded()
    try:
        print(await ensure_corpus("embedded", retriever, docs, embedder), flush=True)
        for bench in BENCHMARKS:
            for tuning in (True, False):
                part = split(queries[bench], tuning, None)
                listed = await _retrieve(retriever, embedder, part)
                path = _path(bench, "tuning" if tuning else "held-out")
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
