"""The request bodies the retriever's reads send: the BM25 and k-NN arms, the hybrid query and
its search pipelines, the exact-cosine rescoring, and which fusion path a method takes.

Every query that reads chunks filters on the tenant, on `VISIBLE` and on what the reader may
read (`readable`: documents without an access list, or with one naming a group of the
reader's), inside both arms: in the BM25 query's filter and in the k-NN clause's own filter,
so HNSW search fills its k from the chunks the reader may see.
"""

from __future__ import annotations

import re
import unicodedata

from backends.retrieval.access import Groups
from backends.retrieval.base import RRF_K, FusionMethod, SearchRequest
from backends.retrieval.opensearch.client import Json
from backends.retrieval.opensearch.config import OpenSearchConfig
from backends.retrieval.stopwords import without_stopwords

_CONTROL_OR_SPACE = re.compile(r"[\s\x00-\x1f\x7f]+")
# Readers never see a chunk of a version whose write has not finished.
VISIBLE: Json = {"bool": {"must_not": {"term": {"pending": True}}}}
# The seam's reading order. `chunk_id` is a keyword, which sorts #10 before #9; a script sort
# needs no mapping change, and it only runs over the one document's chunks.
READING_ORDER: list[Json] = [
    {
        "_script": {
            "type": "number",
            "script": {
                "lang": "painless",
                "source": (
                    "String id = doc['chunk_id'].value;"
                    " String n = id.substring(id.lastIndexOf('#') + 1);"
                    " try { return Long.parseLong(n); }"
                    " catch (NumberFormatException e) { return Long.MAX_VALUE; }"
                ),
            },
        }
    },
    {"chunk_id": "asc"},
]


def normalise_query(text: str, max_chars: int, max_terms: int) -> str:
    """Plain text safe to send as a `match` query; empty when nothing searchable is left.

    `multi_match` never parses Lucene syntax, so `title:(foo OR "bar` is just words; what is left
    to guard against is size (clause limits) and input with no letters or digits at all.
    """
    text = unicodedata.normalize("NFKC", text)[:max_chars]
    words = _CONTROL_OR_SPACE.sub(" ", text).split(" ")
    kept = [w for w in dict.fromkeys(words) if any(ch.isalnum() for ch in w)]
    return " ".join(without_stopwords(kept)[:max_terms])


def readable(groups: Groups) -> Json:
    """Chunks a reader in `groups` may read: of a document without an access list (`groups`
    unset), or with one naming a group of the reader's."""
    public: Json = {"bool": {"must_not": {"exists": {"field": "groups"}}}}
    if not groups:
        return public
    shared: Json = {"terms": {"groups": sorted(groups)}}
    return {"bool": {"should": [public, shared], "minimum_should_match": 1}}


def tenant_visible(tenant: str) -> Json:
    """The tenant's chunks that readers may see, whatever their access lists (counts)."""
    return {"bool": {"filter": [{"term": {"tenant": tenant}}, VISIBLE]}}


def reader_visible(tenant: str, groups: Groups) -> Json:
    """The tenant's chunks that a reader in `groups` may see."""
    return {"bool": {"filter": [{"term": {"tenant": tenant}}, VISIBLE, readable(groups)]}}


def document_visible(tenant: str, doc_id: str, groups: Groups) -> Json:
    """The visible chunks of one of the tenant's documents, if a reader in `groups` may
    read it."""
    terms: list[Json] = [
        {"term": {"tenant": tenant}},
        {"term": {"doc_id": doc_id}},
        VISIBLE,
        readable(groups),
    ]
    return {"bool": {"filter": terms}}


def bm25_body(config: OpenSearchConfig, request: SearchRequest, text: str) -> Json:
    return {
        "size": request.candidates,
        "_source": {"excludes": ["embedding"]},
        "query": {
            "bool": {
                "must": {"multi_match": {"query": text, "fields": list(config.fields)}},
                "filter": [{"term": {"tenant": request.tenant}}, VISIBLE, readable(request.groups)],
            }
        },
    }


def knn_body(request: SearchRequest) -> Json:
    return {
        "size": request.candidates,
        "_source": {"excludes": ["embedding"]},
        "query": {
            "knn": {
                "embedding": {
                    "vector": request.vector.astype(float).tolist(),
                    "k": request.candidates,
                    # Efficient filtering: HNSW search restricted to the tenant's documents the
                    # reader may read, so a k-NN arm never comes back short or with another
                    # tenant's chunk, or one outside the reader's groups.
                    "filter": reader_visible(request.tenant, request.groups),
                }
            }
        },
    }


def hybrid_body(config: OpenSearchConfig, request: SearchRequest, text: str) -> Json:
    """One hybrid query over both arms, for the node to fuse."""
    return {
        # The whole fused list, cut to k after the contract's tie order (chunk id): with
        # size k the node cuts equal scores by its own doc order, and the k-th hit could
        # differ from the client-side path's (8 of 300 held-out FanOutQA queries did).
        "size": max(request.k, request.candidates),
        "_source": {"excludes": ["embedding"]},
        "query": {
            "hybrid": {
                # Both arms rank `candidates` deep before fusion, as on the client-side path.
                "pagination_depth": request.candidates,
                "queries": [
                    bm25_body(config, request, text)["query"],
                    knn_body(request)["query"],
                ],
            }
        },
    }


def cosine_body(request: SearchRequest, keys: list[str]) -> Json:
    """One exact script_score over just these chunks: each one's cosine to the query, plus 1."""
    return {
        "size": len(keys),
        "_source": False,
        "query": {
            "script_score": {
                "query": {
                    "bool": {
                        "filter": [
                            {"term": {"tenant": request.tenant}},
                            {"ids": {"values": keys}},
                            readable(request.groups),
                        ]
                    }
                },
                # script_score refuses negative scores: 1 + cos, taken back by the caller.
                "script": {
                    "source": "1.0 + cosineSimilarity(params.vector, doc['embedding'])",
                    "params": {"vector": request.vector.astype(float).tolist()},
                },
            }
        },
    }


def server_fusable(method: FusionMethod, request: SearchRequest) -> bool:
    """Whether the node's pipelines fuse `method` with these weights as `base.fuse` does."""
    if method == "rrf":
        return request.lexical_weight == 1.0 and request.dense_weight == 1.0
    return method == "minmax" and request.lexical_weight + request.dense_weight > 0


def fusion_path(config: OpenSearchConfig, neural_search: bool | None, method: FusionMethod) -> str:
    """Where hybrid search with `method` fuses, and why: what start-up logs. `neural_search`
    is whether the node has the plugin (None: not asked yet)."""
    if method not in ("rrf", "minmax"):
        why = {
            "minmax_peak": "its weights read both arms' scores before fusing",
            "zscore": "neural-search's z_score differs from base.fuse on missed documents",
        }
        return f"client-side, one _msearch ({why.get(method, method)})"
    if config.server_side_fusion == "off":
        return "client-side, one _msearch (server_side_fusion: off)"
    if not neural_search:
        return "client-side, one _msearch (neural-search is not installed on the node)"
    if method == "rrf":
        return (
            "server-side with equal weights (hybrid query + score-ranker-processor rrf), "
            "client-side otherwise"
        )
    return "server-side (hybrid query + normalization-processor min_max, weighted arithmetic_mean)"


def minmax_pipeline(lexical_share: float, dense_share: float) -> Json:
    """A temporary search pipeline (in the request body): min-max per arm, lowest 0.001 as in
    `base.fuse`, a missed document adding 0, combined as the weighted mean (weights sum to 1)."""
    return {
        "phase_results_processors": [
            {
                "normalization-processor": {
                    "normalization": {"technique": "min_max"},
                    "combination": {
                        "technique": "arithmetic_mean",
                        "parameters": {"weights": [lexical_share, dense_share]},
                    },
                }
            }
        ]
    }


def rrf_pipeline() -> Json:
    return {
        "description": "querygate hybrid: reciprocal rank fusion of BM25 and k-NN",
        "phase_results_processors": [
            {
                "score-ranker-processor": {
                    "combination": {"technique": "rrf", "parameters": {"rank_constant": RRF_K}}
                }
            }
        ],
    }
