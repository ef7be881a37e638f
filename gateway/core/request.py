"""The request as the core sees it: what was asked (`QueryRequest`) and what the stages learn
about it on its way through the pipeline (`RequestContext`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.llm.base import NO_OPTIONS, GenerationOptions, Message, Usage
from backends.retrieval.access import NO_GROUPS, Groups
from backends.retrieval.base import Hit, Vector
from gateway.cache.stages import CacheState
from gateway.core.reranks import RequestReranks
from gateway.core.scope import RequestScope
from gateway.limits.budget import BudgetedLLM
from gateway.obs.timing import StageTimer
from gateway.settings import TenantConfig
from routers.types import Answer, Generation, RouteDecision

# What the stages end in: an answer, or the last model call that writes it.
Outcome = Answer | Generation


@dataclass(frozen=True, slots=True)
class QueryRequest:
    id: str
    tenant: TenantConfig
    query: str
    history: tuple[Message, ...] = ()
    route: str = "auto"
    # Set when `query` is a rewrite of what the client sent.
    original_query: str | None = None
    # `Cache-Control: no-cache`: answer afresh (the answer may still be stored);
    # `no-store`: do not store it.
    cache_lookup: bool = True
    cache_store: bool = True
    # The client's parameters for the calls that write the answer (the chat endpoint's).
    options: GenerationOptions = NO_OPTIONS
    # What followed the question: the model's calls of the client's tools and their results.
    trailing: tuple[Message, ...] = ()


@dataclass(slots=True)
class RequestContext:
    """One request as it flows through the stages; each stage adds what it learns."""

    request: QueryRequest
    timer: StageTimer
    # The LLM seam bound to the request's tenant: every model call it makes goes through it.
    llm: BudgetedLLM
    # None outside HTTP (the CLI, benchmarks, tests): no deadline, no record to account on.
    scope: RequestScope | None = None
    # Model calls made before the route's own (the follow-up rewrite).
    usage_before: dict[str, Usage] = field(default_factory=dict)
    # The cache stages' findings: key, scope, the tier that answered, the single flight.
    cache: CacheState = field(default_factory=CacheState)
    vector: Vector | None = None
    # None for a cache hit: nothing was decided.
    decision: RouteDecision | None = None
    corpus: tuple[Hit, ...] = ()
    route_reason: str = ""
    # What a stage has to tell the client about how its question was taken (an unrewritten
    # follow-up): added to the answer's notes, and to its text when no model writes it.
    notes: list[str] = field(default_factory=list)
    outcome: Outcome | None = None
    # The rerank stage's decisions for this request (None: no route ran a search).
    reranks: RequestReranks | None = None

    @property
    def groups(self) -> Groups:
        """The end user's groups (`RequestScope.groups`); outside HTTP, none: the documents
        without an access list only."""
        return self.scope.groups if self.scope is not None else NO_GROUPS
