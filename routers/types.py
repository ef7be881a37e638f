"""The values that flow through routing: routes, decisions, answers and citations."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from backends.llm.base import Message, Tier, Usage
from backends.retrieval.base import Vector

if TYPE_CHECKING:
    from routers.policy import RouteDecision


class Route(StrEnum):
    DIRECT = "direct"
    LOOKUP = "lookup"
    MULTIHOP = "multihop"
    FULL_CONTEXT = "full_context"


@dataclass(frozen=True, slots=True)
class Classification:
    """What the classifier thinks, before policy: a route, how sure, and why."""

    route: Route
    confidence: float
    # Each reason is a short machine-friendly tag, e.g. "greeting", "feature:compare", "p=0.91".
    reasons: tuple[str, ...] = ()
    scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Citation:
    doc_id: str
    chunk_id: str
    title: str
    snippet: str
    score: float


@dataclass(frozen=True, slots=True)
class Answer:
    """What a route executor returns; the pipeline adds ids, cache state and timings."""

    text: str
    route: Route
    citations: tuple[Citation, ...] = ()
    usage_by_tier: dict[str, Usage] = field(default_factory=dict)
    # extractive: no model was configured, so the answer is the best passages verbatim.
    extractive: bool = False
    # complete: safe to cache (confident, not truncated, not a "not enough evidence" answer).
    complete: bool = True
    escalated: bool = False
    # Why the route escalated: a short tag from a closed set, safe as a metric label.
    escalation_reason: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Generation:
    """An answer still to be written by a model. The pipeline completes or streams it, then
    `routers.generation.finish` turns the text into an Answer with the sources it cited."""

    route: Route
    tier: Tier
    messages: tuple[Message, ...]
    # Numbered from 1 in the prompt; the model cites them as [n].
    sources: tuple[Citation, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What a route executor gets: the tenant, the (rewritten) query, its vector, the history."""

    tenant: str
    query: str
    vector: Vector
    history: tuple[Message, ...]
    decision: RouteDecision
