"""What the pipeline hands the HTTP layer: one answered question and how it was answered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.ingest.progress import PartialIndex
from routers.types import Answer, RouteDecision


@dataclass(frozen=True, slots=True)
class QueryResult:
    id: str
    answer: Answer
    # The question as answered; `original_query` is what the client sent when it was rewritten.
    query: str
    original_query: str | None
    route_reason: str
    decision: RouteDecision | None
    cache: str  # miss | exact | semantic: the tier that answered
    timings_ms: dict[str, float]
    config_version: str
    # For `debug`: the lookup's result and what the semantic tier compared (None: no lookup).
    cache_debug: dict[str, Any] | None = None
    # For `debug`: each search's rerank decision (None: no route searched).
    rerank_debug: list[dict[str, Any]] | None = None
    # Set while the tenant's index is still being filled (an ingest in this process): the
    # answer comes from the documents indexed so far.
    partial_index: PartialIndex | None = None


def partial_fields(result: QueryResult) -> dict[str, Any]:
    """Present only while the tenant's index is partial: documents done and total."""
    if result.partial_index is None:
        return {}
    return {"partial_index": result.partial_index.as_dict()}


def rewrite_fields(result: QueryResult) -> dict[str, str]:
    """Present only when the question was rewritten: what was sent and what was answered."""
    if result.original_query is None:
        return {}
    return {"original_query": result.original_query, "rewritten_query": result.query}
