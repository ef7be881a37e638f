"""Hybrid search, reading a document's chunks back, and a tenant's counts.

Fusion runs server-side (one hybrid query) when neural-search is installed and
`server_side_fusion` allows it, for `rrf` with equal weights and for `minmax` (normalization-
processor: min_max + weighted arithmetic_mean, ranking as `base.fuse` does); everything else,
including the default `minmax_peak` (its weights read both arms' scores first), fuses
client-side with `base.fuse` over one `_msearch`. Which path each method takes is decided at
start-up and logged (`fusion_path`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from backends.errors import BackendUnavailable, UpstreamError
from backends.retrieval.access import Groups
from backends.retrieval.base import (
    RRF_K,
    ArmRanking,
    FusionMethod,
    Hit,
    SearchRequest,
    document_chunk_limit,
    fuse,
)
from backends.retrieval.opensearch.client import BACKEND, Json, translated
from backends.retrieval.opensearch.layout import IndexLayout
from backends.retrieval.opensearch.queries import (
    READING_ORDER,
    bm25_body,
    cosine_body,
    document_visible,
    hybrid_body,
    knn_body,
    minmax_pipeline,
    normalise_query,
    server_fusable,
    tenant_visible,
)


class Search:
    """The reads of one retriever."""

    def __init__(self, layout: IndexLayout) -> None:
        self._layout = layout
        self._client = layout.client
        self._config = layout.config

    async def search(self, request: SearchRequest) -> list[Hit]:
        await self._layout.ensure_ready()
        self._layout.check_vector(request.vector)
        cfg = self._config
        text = normalise_query(request.text, cfg.max_query_chars, cfg.max_query_terms)
        bm25 = bm25_body(cfg, request, text) if text and request.mode != "dense" else None
        dense = knn_body(request) if request.mode != "bm25" else None
        method = request.fusion or cfg.fusion
        if bm25 and dense and server_fusable(method, request) and await self._layout.server_side():
            return await self._server_side(request, text, method)
        return await self._client_side(request, bm25, dense)

    async def _client_side(
        self, request: SearchRequest, bm25: Json | None, dense: Json | None
    ) -> list[Hit]:
        arms = [(name, body) for name, body in (("bm25", bm25), ("dense", dense)) if body]
        if not arms:
            return []
        lines: list[Json] = []
        index = self._config.tenant_alias(request.tenant)
        for _, body in arms:
            # A tenant without an index yet (index_per_tenant) has no hits, not an error.
            lines += [{"index": index, "ignore_unavailable": True}, body]
        with translated("search"):
            response = await self._client.msearch(body=lines)
        ranked = {
            name: _arm_hits(res) for (name, _), res in zip(arms, response["responses"], strict=True)
        }
        weights = {"bm25": request.lexical_weight, "dense": request.dense_weight}
        rankings = [
            ArmRanking([h["_id"] for h in hits], [float(h["_score"]) for h in hits], weights[name])
            for name, hits in ranked.items()
        ]
        fused = fuse(rankings, request.fusion or self._config.fusion)
        return _best_first(_to_hits(fused, ranked))[: request.k]

    async def _server_side(
        self, request: SearchRequest, text: str, method: FusionMethod
    ) -> list[Hit]:
        body = hybrid_body(self._config, request, text)
        params = {"ignore_unavailable": "true"}
        scale = 1.0
        if method == "rrf":
            params["search_pipeline"] = self._config.pipeline
        else:
            weights = request.lexical_weight + request.dense_weight
            body["search_pipeline"] = minmax_pipeline(
                request.lexical_weight / weights, request.dense_weight / weights
            )
            # The node returns the weighted mean; `fuse` the weighted sum over rrf_k + 1.
            scale = weights / (RRF_K + 1)
        with translated("search"):
            response = await self._client.search(
                index=self._config.tenant_alias(request.tenant), body=body, params=params
            )
        raw = response["hits"]["hits"]
        fused = [(h["_id"], float(h["_score"]) * scale) for h in raw]
        hits = _best_first(_to_hits(fused, {"server": raw}))[: request.k]
        keys = {h["_source"]["chunk_id"]: str(h["_id"]) for h in raw}
        return await self._with_cosines(request, hits, keys)

    async def _with_cosines(
        self, request: SearchRequest, hits: list[Hit], keys: Mapping[str, str]
    ) -> list[Hit]:
        """Fused in the node, hits come back without their arms' scores, but the sufficiency
        grade reads the best cosine (at 0 it escalates every lookup) and the agent's relevance
        filter reads each hit's. One exact script_score over just these k chunks fills them in."""
        if not hits:
            return hits
        body = cosine_body(request, [keys[h.chunk_id] for h in hits])
        with translated("search"):
            response = await self._client.search(
                index=self._config.tenant_alias(request.tenant),
                body=body,
                params={"ignore_unavailable": "true"},
            )
        cosine = {str(h["_id"]): float(h["_score"]) - 1.0 for h in response["hits"]["hits"]}
        return [replace(h, dense_score=cosine.get(keys[h.chunk_id])) for h in hits]

    async def document_chunks(
        self, tenant: str, doc_id: str, limit: int, groups: Groups
    ) -> list[Hit]:
        await self._layout.ensure_ready()
        body = {
            "size": document_chunk_limit(limit),
            "_source": {"excludes": ["embedding"]},
            "query": document_visible(tenant, doc_id, groups),
            "sort": READING_ORDER,
        }
        with translated("document_chunks"):
            response = await self._client.search(
                index=self._config.tenant_alias(tenant), body=body, ignore_unavailable=True
            )
        return [_read_hit(h["_source"]) for h in response["hits"]["hits"]]

    async def stats(self, tenant: str) -> tuple[int, int]:
        await self._layout.ensure_ready()
        body = {
            "size": 0,
            "track_total_hits": True,
            "query": tenant_visible(tenant),
            # Exact below the precision threshold, which is the most OpenSearch allows.
            "aggs": {"docs": {"cardinality": {"field": "doc_id", "precision_threshold": 40000}}},
        }
        with translated("stats"):
            response = await self._client.search(
                index=self._config.tenant_alias(tenant), body=body, ignore_unavailable=True
            )
        # No aggregations at all when the tenant has no index yet.
        docs = response.get("aggregations", {}).get("docs", {}).get("value", 0)
        return int(docs), int(response["hits"]["total"]["value"])


def _arm_hits(response: Mapping[str, Any]) -> list[Json]:
    """Hits of one `_msearch` arm; a failed arm fails the search instead of thinning it."""
    if "error" in response:
        status = int(response.get("status", 500))
        detail = f"search arm failed: HTTP {status} {response['error']}"
        if status >= 500 or status == 429:
            raise BackendUnavailable(BACKEND, detail)
        raise UpstreamError(BACKEND, detail)
    return list(response["hits"]["hits"])


def _to_hits(fused: Sequence[tuple[str, float]], arms: Mapping[str, list[Json]]) -> list[Hit]:
    """Build Hits from fused (id, score) using each arm's raw hits for ranks and sources."""
    source: dict[str, Json] = {}
    rank: dict[tuple[str, str], tuple[int, float]] = {}
    for name, hits in arms.items():
        for position, hit in enumerate(hits, start=1):
            source.setdefault(hit["_id"], hit["_source"])
            rank[(name, hit["_id"])] = (position, float(hit["_score"]))
    out = []
    for key, score in fused:
        src = source[key]
        bm25, dense = rank.get(("bm25", key)), rank.get(("dense", key))
        out.append(
            Hit(
                doc_id=src["doc_id"],
                chunk_id=src["chunk_id"],
                title=src["title"],
                section=src["section"],
                text=src["text"],
                score=score,
                bm25_rank=bm25[0] if bm25 else None,
                dense_rank=dense[0] if dense else None,
                bm25_score=bm25[1] if bm25 else None,
                dense_score=_cosine(dense[1]) if dense else None,
            )
        )
    return out


def _cosine(knn_score: float) -> float:
    """The cosine behind a lucene cosinesimil score, (1 + cos) / 2: Hit.dense_score is a cosine
    on both backends, as the sufficiency model and the agent's min_similarity read it."""
    return 2.0 * knn_score - 1.0


def _read_hit(source: Json) -> Hit:
    """A chunk read back by `document_chunks`: no arm ranked it."""
    return Hit(
        doc_id=source["doc_id"],
        chunk_id=source["chunk_id"],
        title=source["title"],
        section=source["section"],
        text=source["text"],
        score=0.0,
    )


def _best_first(hits: list[Hit]) -> list[Hit]:
    """The retrieval contract's order: score descending, ties broken by chunk id."""
    return sorted(hits, key=lambda h: (-h.score, h.chunk_id, h.doc_id))
