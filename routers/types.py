"""The values that flow through routing: routes, decisions, answers and citations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from backends.llm.base import (
    LLM,
    NO_OPTIONS,
    Cut,
    GenerationOptions,
    Message,
    Tier,
    ToolCall,
    Usage,
)
from backends.retrieval.access import NO_GROUPS, Groups
from backends.retrieval.base import Hit, Vector

if TYPE_CHECKING:
    from routers.rerank import RerankRecorder


# Opens a span of the request's trace around a `with` block, named and with bounded attributes
# (the gateway's is `gateway.obs.tracing.child`); routers never see a tracer.
SpanOpener = Callable[[str, Mapping[str, str | int]], AbstractContextManager[object]]


def no_span(name: str, attributes: Mapping[str, str | int]) -> AbstractContextManager[object]:
    """The `SpanOpener` that traces nothing (an evaluation, a benchmark)."""
    return nullcontext()


# "ok", or why an agent's tool call did not run or failed: a metric label and a debug field.
ToolStatus = Literal["ok", "invalid_arguments", "timeout", "unavailable", "failed", "cap_reached"]
# How an answer was made once the agent's model failed mid-loop: another tier wrote it from the
# passages found, or they are quoted.
Degraded = Literal["fallback_tier", "extractive"]


class Route(StrEnum):
    DIRECT = "direct"
    LOOKUP = "lookup"
    MULTIHOP = "multihop"
    FULL_CONTEXT = "full_context"


# What the evidence grade found (a metric label): why a lookup escalates, or "sufficient".
GradeReason = Literal[
    "no_hits", "low_coverage", "arms_disagree", "learned_insufficient", "sufficient"
]
# The agent loop's cap that stopped it (a metric label).
Cap = Literal["steps", "tool_calls", "tokens", "cost", "deadline"]


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
class ChunkGrade:
    """How the agent's relevance grade judged one retrieved chunk."""

    chunk_id: str
    similarity: float | None  # dense cosine to the search; None when only BM25 found it
    kept: bool


@dataclass(frozen=True, slots=True)
class ToolRun:
    """One tool call of the agent loop, as the debug trace shows it."""

    name: str
    arguments: dict[str, Any]
    status: ToolStatus
    # Chunks the call returned to the model (after grading), and how many grading dropped.
    chunk_ids: tuple[str, ...] = ()
    dropped: int = 0
    ms: float = 0.0
    # Every hit a search returned, with its grade (empty for other tools).
    grades: tuple[ChunkGrade, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentStep:
    """One model turn of the agent loop and the tool calls it asked for."""

    tier: Tier
    model: str
    usage: Usage
    model_ms: float
    tools: tuple[ToolRun, ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """What a route executor returns; the pipeline adds ids, cache state and timings."""

    text: str
    route: Route
    citations: tuple[Citation, ...] = ()
    usage_by_tier: dict[str, Usage] = field(default_factory=dict)
    # extractive: no model was configured, so the answer is the best passages verbatim.
    extractive: bool = False
    # complete: safe to cache (confident, not truncated, not a "not enough evidence" answer, and
    # not escalated: the lookup that escalated was not confident in its own evidence).
    complete: bool = True
    escalated: bool = False
    # Why the route escalated: a short tag from a closed set, safe as a metric label.
    escalation_reason: str | None = None
    notes: tuple[str, ...] = ()
    # Some usage was estimated: the upstream reported none.
    usage_estimated: bool = False
    # The agent loop's turns (multihop only), for `debug`, and the cap that stopped it.
    steps: tuple[AgentStep, ...] = ()
    cap: Cap | None = None
    # The agent's model failed mid-loop and this answer was made from the passages it had
    # found: "fallback_tier" (another tier wrote it) or "extractive" (quoted). A metric label.
    degraded: Degraded | None = None
    # The client's own tools the model called (direct only), and why the model stopped:
    # stop, length (cut at the token limit) or tool_calls.
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    # The model's reply passed the gateway's bound on what it reads of one (its token limit
    # with a margin, or a byte cap) and was cut there: "tokens" or "bytes".
    reply_cut: Cut | None = None


class OptionNotHonoured(Exception):
    """The client asked for a generation parameter this route cannot honour (client tools
    or a response format on a route that answers from sources); the message names it."""


@dataclass(frozen=True, slots=True)
class Generation:
    """An answer still to be written by a model. The pipeline completes or streams it, then
    `routers.generation.finish` turns the text into an Answer with the sources it cited.

    An executor that already spent model calls (the agent loop) hands their usage and trace on
    here, so the final Answer accounts for every call whichever path wrote the last one.
    """

    route: Route
    tier: Tier
    messages: tuple[Message, ...]
    # Numbered from 1 in the prompt; the model cites source n as [source_tag-n], the only
    # form `routers.generation.finish` maps to a citation (see `routers.prompts`).
    sources: tuple[Citation, ...] = ()
    source_tag: str | None = None
    usage_by_tier: dict[str, Usage] = field(default_factory=dict)
    steps: tuple[AgentStep, ...] = ()
    escalation_reason: str | None = None
    notes: tuple[str, ...] = ()
    # Seconds the final call may take (the agent's deadline); None: the request's deadline.
    timeout_s: float | None = None
    cap: Cap | None = None
    # Completion limit of the call; None: the tier's own.
    max_tokens: int | None = None
    # Earlier calls' usage was estimated.
    usage_estimated: bool = False
    # What to answer when the call cannot finish within `timeout_s` (the agent's plain answer).
    fallback: Answer | None = None
    # What to answer when the call fails, its tier's retries and fallbacks spent, unless the
    # client's own parameters caused it (the agent's passages quoted, at a cap); None: it fails.
    on_failure: Answer | None = None
    # The client's generation parameters for this call.
    options: GenerationOptions = NO_OPTIONS


@dataclass(frozen=True, slots=True)
class Escalation:
    """A lookup whose evidence was graded insufficient: the pipeline hands it to multihop."""

    reason: GradeReason
    note: str
    # The best of what the lookup found, for an honest answer when multihop cannot run.
    sources: tuple[Citation, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteDecision:
    route: Route
    # A short tag from a closed set (or a configured rule name), safe as a metric label.
    reason: str
    # What a person reads in `route_reason`: the tag plus the evidence behind it.
    explanation: str
    classification: Classification
    lexical_weight: float
    dense_weight: float
    # The route the policy wanted when this deployment could not execute it.
    wanted: Route | None = None
    # Full context would answer this if the tenant's corpus fits the budget.
    full_context_candidate: bool = False


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What a route executor gets: the tenant, the (rewritten) query, its vector, the history,
    and the end user's groups, which every read it makes for the request passes on."""

    tenant: str
    query: str
    vector: Vector
    history: tuple[Message, ...]
    decision: RouteDecision
    # The end user's groups: searches, reads and the corpus see only what they may read.
    groups: Groups = NO_GROUPS
    # Set when a lookup escalated to this route: why.
    escalation: Escalation | None = None
    # The tenant's whole corpus, read only once the policy chose full context.
    corpus: tuple[Hit, ...] = ()
    # The client's generation parameters, for the calls that write the answer.
    options: GenerationOptions = NO_OPTIONS
    # What followed the question: the model's calls of the client's tools and their results
    # (direct only: a conversation with tool calls anywhere is a plain model call).
    trailing: tuple[Message, ...] = ()
    # The request's model calls, bound to its tenant (the gateway's per-request view of the
    # seam); None: the executor's own `LLM` (an evaluation, a benchmark).
    llm: LLM | None = None
    # Keeps the request's rerank decisions (its timings, metrics, debug and the tenant's cost);
    # None: they are not kept. `deadline`: the request's, a `time.monotonic()` instant.
    reranks: RerankRecorder | None = None
    deadline: float | None = None

    @property
    def has_tool_messages(self) -> bool:
        return bool(self.trailing) or any(m.role == "tool" or m.tool_calls for m in self.history)
