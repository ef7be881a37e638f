"""`querygate eval retrieval`: the tenant's index searched for labelled questions, scored.

Each question is searched three ways, BM25 only, dense only and fused, with the request the
lookup route makes (the configured `retrieval.candidates`, arm weights from the policy: rules
and the identifier weighting apply as they do for a lookup of that question). Document level:
a document's rank is the position of its first chunk among the hits; recall@k is the share of
a question's relevant documents ranked within k, averaged over questions; MRR@10 the mean of
1 / the best-ranked relevant document's rank (0 when none is in the top 10). With a reranker
configured (`retrieval.rerank`), the fused hits are also reranked and scored beside fusion
(`gateway.eval.rerank`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from backends.retrieval.base import SearchRequest
from gateway.eval.deployment import embed_all, require_documents, tenant_flags
from gateway.eval.examples import read_retrieval_examples
from gateway.eval.rerank import RerankRows
from gateway.eval.stats import (
    MRR_DEPTH,
    bootstrap_settings,
    document_ranks,
    estimate,
    recall_at,
    reciprocal_rank,
)
from gateway.settings import Settings

ARMS: tuple[Literal["bm25", "dense", "hybrid"], ...] = ("bm25", "dense", "hybrid")


async def evaluate_retrieval(
    settings: Settings, path: Path, tenant: str, *, k: int = 10, show: int = 10
) -> dict[str, Any]:
    from backends.embeddings.config import build_embedder
    from gateway.core.routing import configured_routes, policy_for, registry_config
    from gateway.core.runtime import build_classifier
    from gateway.server.services import build_reranker, build_retriever
    from routers.policy import decide

    examples = read_retrieval_examples(path, settings.server.max_query_chars)
    tenant_flags(settings, tenant)
    # The weights a lookup of each question gets: forcing lookup keeps the classifier's
    # evidence for rules and applies the identifier weighting.
    policy = policy_for(settings, tenant, configured_routes(settings))
    candidates = registry_config(settings).lookup.candidates
    depth = max(k, MRR_DEPTH)
    embedder = build_embedder(settings.embeddings)
    retriever = build_retriever(settings, embedder.dimension)
    reranker = build_reranker(settings)
    rows = None if reranker is None else RerankRows(settings.retrieval.rerank, reranker, k, depth)
    try:
        await require_documents(retriever, settings, tenant)
        relevant = sorted({d for e in examples for d in e.relevant})
        stored = await retriever.content_hashes(tenant, relevant)
        classifier = build_classifier(settings, embedder.model_id)
        vectors = await embed_all(embedder, [e.question for e in examples])
        recall: dict[str, list[float]] = {arm: [] for arm in ARMS}
        rr: dict[str, list[float]] = {arm: [] for arm in ARMS}
        misses = []
        for example, vector in zip(examples, vectors, strict=True):
            classification = classifier.classify(example.question, vector)
            decision = decide(classification, "lookup", example.question, policy)
            for arm in ARMS:
                hits = await retriever.search(
                    SearchRequest(
                        tenant=tenant,
                        text=example.question,
                        vector=vector,
                        k=rows.fetch() if rows is not None and arm == "hybrid" else depth,
                        mode=arm,
                        lexical_weight=decision.lexical_weight,
                        dense_weight=decision.dense_weight,
                        candidates=candidates,
                    )
                )
                if rows is not None and arm == "hybrid":
                    await rows.add(tenant, example, hits)
                    hits = hits[:depth]
                ranks = document_ranks([h.doc_id for h in hits])
                recall[arm].append(recall_at(ranks, example.relevant, k))
                rr[arm].append(reciprocal_rank(ranks, example.relevant))
                if arm == "hybrid" and recall[arm][-1] < 1:
                    misses.append(
                        {
                            "line": example.line,
                            "id": example.label,
                            "question": example.question,
                            "missing": [d for d in example.relevant if ranks.get(d, k + 1) > k],
                            "ranks": {d: ranks.get(d) for d in example.relevant},
                            "top": list(ranks)[:3],
                            "lexical_weight": decision.lexical_weight,
                        }
                    )
    finally:
        await retriever.aclose()
        await embedder.aclose()
        if reranker is not None:
            await reranker.aclose()
    arrays = {arm: np.array(recall[arm]) for arm in ARMS}
    hybrid = arrays["hybrid"]
    return {
        "evaluation": "retrieval",
        "file": str(path),
        "tenant": tenant,
        "config_version": settings.version,
        "backend": settings.retrieval.backend,
        # Where the configuration names no fusion method, the backends fuse by RRF.
        "fusion": str(getattr(settings.retrieval, "fusion", "rrf")),
        "k": k,
        "n": len(examples),
        "arms": {
            arm: {
                "recall_at_k": estimate(arrays[arm]).as_dict(),
                "mrr_at_10": estimate(np.array(rr[arm])).as_dict(),
            }
            for arm in ARMS
        },
        # Paired: the same resampled questions for both arms.
        "hybrid_minus_arm_recall_at_k": {
            arm: estimate(hybrid - arrays[arm]).as_dict() for arm in ("bm25", "dense")
        },
        # With and without reranking, side by side (absent: no reranker is configured).
        **({"rerank": rows.report(recall["hybrid"], rr["hybrid"])} if rows is not None else {}),
        "relevant_not_in_index": [d for d in relevant if d not in stored],
        "missed": len(misses),
        "misses": misses[:show],
        "bootstrap": bootstrap_settings(),
    }
