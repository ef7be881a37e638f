"""`querygate eval routes`: the configuration's routing decisions scored against labels.

Each question goes through the configuration's own classifier and policy (thresholds, rules,
identifiers, the routes this deployment can execute) exactly as `POST /v1/route` decides it;
no LLM is called and nothing is answered. The tenant's index is read only where the decision
needs it: whether the whole corpus fits (full context, when configured) and, with
`--with-escalation`, the lookup's own retrieval, rerank stage (when `retrieval.rerank` names a
reranker) and evidence grade (`routers.lookup.gather_evidence`): a lookup that escalates ends
on multihop where this deployment can run it, as the pipeline does. A follow-up (history
given) is classified as written: the small model's rewrite is not run, and the report counts
such lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.retrieval.access import NO_GROUPS
from backends.retrieval.base import Retriever
from gateway.eval.deployment import embed_all, require_documents, tenant_flags
from gateway.eval.errors import EvalError
from gateway.eval.examples import ROUTE_LABELS, read_route_examples
from gateway.eval.stats import Estimate, bootstrap_settings, estimate, rounded
from gateway.settings import Settings
from routers.types import Route


@dataclass(frozen=True, slots=True)
class RouteScores:
    accuracy: Estimate
    multihop_recall: Estimate
    # Of the questions labelled lookup (single-hop), the share that ends on multihop.
    single_hop_flagged_multihop: Estimate
    per_route: dict[str, dict[str, float | int | None]]
    routes: tuple[str, ...]  # the confusion matrix's row and column order
    confusion: list[list[int]]  # rows expected, columns predicted


def route_scores(expected: Sequence[Route], predicted: Sequence[Route]) -> RouteScores:
    y, p = np.array([r.value for r in expected]), np.array([r.value for r in predicted])
    routes = tuple(r for r in ROUTE_LABELS if r in set(y) | set(p))
    multihop, lookup = y == Route.MULTIHOP.value, y == Route.LOOKUP.value
    on_multihop = (p == Route.MULTIHOP.value).astype(np.float64)
    per_route: dict[str, dict[str, float | int | None]] = {}
    for route in routes:
        true, said = y == route, p == route
        hits = int((true & said).sum())
        per_route[route] = {
            "precision": rounded(hits / said.sum()) if said.any() else None,
            "recall": rounded(hits / true.sum()) if true.any() else None,
            "support": int(true.sum()),
            "predicted": int(said.sum()),
        }
    return RouteScores(
        accuracy=estimate((y == p).astype(np.float64)),
        multihop_recall=estimate(np.where(multihop, on_multihop, np.nan)),
        single_hop_flagged_multihop=estimate(np.where(lookup, on_multihop, np.nan)),
        per_route=per_route,
        routes=routes,
        confusion=[[int(((y == a) & (p == b)).sum()) for b in routes] for a in routes],
    )


async def evaluate_routes(
    settings: Settings,
    path: Path,
    tenant: str,
    *,
    with_escalation: bool = False,
    show: int = 10,
) -> dict[str, Any]:
    from backends.embeddings.config import build_embedder
    from gateway.core.routing import configured_routes, policy_for, registry_config
    from gateway.core.runtime import build_classifier
    from gateway.server.services import build_reranker, build_retriever
    from gateway.settings import ConfigError
    from routers.full_context import corpus_chunks
    from routers.lookup import gather_evidence
    from routers.policy import decide, with_full_context
    from routers.rerank import RerankStage
    from routers.rewrite import looks_like_followup
    from routers.sufficiency import SufficiencyModelMismatch, use_model
    from routers.types import Escalation, RouteContext

    examples = read_route_examples(path, settings.server.max_query_chars)
    force, whole_corpus = tenant_flags(settings, tenant)
    executable = configured_routes(settings)
    policy = policy_for(
        settings, tenant, executable, allow_force_route=force, whole_corpus_allowed=whole_corpus
    )
    params = registry_config(settings).lookup
    if with_escalation and params.grading is None:
        raise EvalError(
            "--with-escalation: router.escalation.enabled is false in this configuration, "
            "so no lookup escalates"
        )
    embedder = build_embedder(settings.embeddings)
    retriever: Retriever | None = None
    # The lookup grades the evidence the rerank stage leaves, as the gateway's does.
    reranker = build_reranker(settings) if with_escalation else None
    rerank = RerankStage(settings.retrieval.rerank, reranker)
    try:
        classifier = build_classifier(settings, embedder.model_id)
        if with_escalation and params.grading is not None and params.grading.method == "learned":
            try:
                use_model(embedder.model_id)
            except SufficiencyModelMismatch as exc:
                raise ConfigError(f"router.escalation.method: {exc}") from exc
        if with_escalation or Route.FULL_CONTEXT in executable:
            retriever = build_retriever(settings, embedder.dimension)
        if with_escalation:
            assert retriever is not None
            await require_documents(retriever, settings, tenant)
        vectors = await embed_all(embedder, [e.question for e in examples])
        corpus_fits: bool | None = None  # whether the tenant's corpus fits: one read per run
        rows: list[dict[str, Any]] = []
        for example, vector in zip(examples, vectors, strict=True):
            classification = classifier.classify(example.question, vector)
            decision = decide(classification, "auto", example.question, policy)
            if decision.full_context_candidate and retriever is not None:
                if corpus_fits is None:
                    # As a user in no group sees it: the documents without an access list.
                    fits = await corpus_chunks(
                        retriever, tenant, NO_GROUPS, vector, settings.router.full_context
                    )
                    corpus_fits = fits is not None
                if corpus_fits:
                    decision = with_full_context(decision)
            route, escalated = decision.route, None
            if with_escalation and route is Route.LOOKUP:
                assert retriever is not None
                ctx = RouteContext(tenant, example.question, vector, example.history, decision)
                outcome = await gather_evidence(ctx, retriever, params, rerank)
                escalated = outcome.reason if isinstance(outcome, Escalation) else None
                if escalated is not None and Route.MULTIHOP in executable:
                    route = Route.MULTIHOP
            rows.append(
                {
                    "line": example.line,
                    "id": example.label,
                    "question": example.question,
                    "expected": example.route.value,
                    "predicted": route.value,
                    "classifier": classification.route.value,
                    "confidence": round(classification.confidence, 4),
                    "reason": decision.reason,
                    "escalated": escalated,
                    "unavailable": decision.wanted.value if decision.wanted else None,
                    "followup": looks_like_followup(example.question, example.history),
                    "explanation": decision.explanation,
                }
            )
    finally:
        if retriever is not None:
            await retriever.aclose()
        if reranker is not None:
            await reranker.aclose()
        await embedder.aclose()
    return _route_report(
        settings, path, tenant, classifier.name, executable, rows, show, with_escalation
    )


def _route_report(
    settings: Settings,
    path: Path,
    tenant: str,
    classifier: str,
    executable: frozenset[Route],
    rows: list[dict[str, Any]],
    show: int,
    with_escalation: bool,
) -> dict[str, Any]:
    expected = [Route(r["expected"]) for r in rows]
    scores = route_scores(expected, [Route(r["predicted"]) for r in rows])
    alone = route_scores(expected, [Route(r["classifier"]) for r in rows])
    wrong = [r for r in rows if r["predicted"] != r["expected"]]
    wrong.sort(key=lambda r: (-r["confidence"], r["line"]))
    rewrites = settings.router.rewrite_followups and settings.models.small is not None
    return {
        "evaluation": "routes",
        "file": str(path),
        "tenant": tenant,
        "config_version": settings.version,
        "classifier": classifier,
        "executable_routes": sorted(r.value for r in executable),
        "with_escalation": with_escalation,
        "n": len(rows),
        "accuracy": scores.accuracy.as_dict(),
        "multihop_recall": scores.multihop_recall.as_dict(),
        "single_hop_flagged_multihop": scores.single_hop_flagged_multihop.as_dict(),
        "per_route": scores.per_route,
        "confusion": {"routes": list(scores.routes), "rows": scores.confusion},
        "classifier_alone": {
            "accuracy": alone.accuracy.as_dict(),
            "multihop_recall": alone.multihop_recall.as_dict(),
        },
        "escalated": sum(r["escalated"] is not None for r in rows) if with_escalation else None,
        "wanted_unavailable_route": sum(r["unavailable"] is not None for r in rows),
        "followups_classified_unrewritten": (sum(r["followup"] for r in rows) if rewrites else 0),
        "misrouted": len(wrong),
        "worst_misroutes": wrong[:show],
        "bootstrap": bootstrap_settings(),
    }
