"""JSON shapes the gateway speaks: the /v1/query body, its debug block and routing decisions."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gateway.core.result import QueryResult, partial_fields, rewrite_fields
from gateway.ingest.progress import PartialIndex
from routers.generation import usage_total
from routers.types import Answer, RouteDecision

# On every answer while the tenant's index is partial: documents done/total.
PARTIAL_INDEX_HEADER = "X-Querygate-Partial-Index"


def partial_headers(partial: PartialIndex | None) -> dict[str, str]:
    return {} if partial is None else {PARTIAL_INDEX_HEADER: partial.header()}


def query_body(result: QueryResult, debug: bool = False) -> dict[str, Any]:
    """The /v1/query answer; `debug` adds the routing decision in full (classifier scores,
    weights), absent on a cache hit since nothing was decided, and the cache lookup (for the
    semantic tier: the nearest similarity, the guards that refused, the cached question served),
    and each search's rerank decision."""
    body = _answer_body(result)
    if debug:
        extra: dict[str, Any] = {}
        if result.decision is not None:
            extra["decision"] = decision_body(result.decision)
        if result.answer.steps:
            extra["agent"] = agent_body(result.answer)
        if result.cache_debug is not None:
            extra["cache"] = result.cache_debug
        if result.rerank_debug:
            extra["rerank"] = result.rerank_debug
        if extra:
            body["debug"] = extra
    return body


def agent_body(answer: Answer) -> dict[str, Any]:
    """The agent loop's turns: tool calls with their arguments, the chunks they returned, how
    many grading dropped, tokens, cost and timings."""
    return {
        "cap": answer.cap,
        "steps": [
            {
                "tier": step.tier,
                "model": step.model,
                "usage": asdict(step.usage),
                "model_ms": step.model_ms,
                "tool_calls": [asdict(run) for run in step.tools],
            }
            for step in answer.steps
        ],
    }


def _answer_body(result: QueryResult) -> dict[str, Any]:
    answer = result.answer
    total = usage_total(answer)
    return {
        "id": result.id,
        "answer": answer.text,
        "route": answer.route.value,
        "route_reason": result.route_reason,
        "escalated": answer.escalated,
        "extractive": answer.extractive,
        "degraded": answer.degraded,
        "reply_cut": answer.reply_cut,
        "citations": [asdict(c) for c in answer.citations],
        "cache": result.cache,
        "usage": {
            "estimated": answer.usage_estimated,
            "prompt_tokens": total.prompt_tokens,
            "completion_tokens": total.completion_tokens,
            "cost_usd": round(total.cost_usd, 8),
            "by_tier": {tier: asdict(u) for tier, u in answer.usage_by_tier.items()},
        },
        "timings_ms": result.timings_ms,
        "config_version": result.config_version,
        **rewrite_fields(result),
        **partial_fields(result),
    }


def decision_body(decision: RouteDecision) -> dict[str, Any]:
    c = decision.classification
    return {
        "route": decision.route.value,
        "route_reason": decision.explanation,
        "reason": decision.reason,
        "classifier": {
            "route": c.route.value,
            "confidence": round(c.confidence, 4),
            "reasons": list(c.reasons),
            "scores": {k: round(v, 4) for k, v in c.scores.items()},
        },
        "lexical_weight": decision.lexical_weight,
    }
