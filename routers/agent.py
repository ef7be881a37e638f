"""The multihop route: a bounded agent loop on the large tier.

One `_Run` per request. Each iteration first checks every cap, then makes one model turn with
the `search` and `read` tools; the tool calls of a turn run concurrently. The loop ends when
the model answers in plain text (citing the numbered passages as [n]), or at a cap:
- steps or tool calls: one last call without tools forces an answer from what was found;
- tokens or cost: the next call could break the cap, so no call is made and the answer says
  plainly where it stopped, citing the best passages found;
- the deadline: the loop gets `deadline_s * (1 - final_share)`, the forced answer the rest.
With nothing relevant found, the answer says the documents do not contain it.

Caps are hard: before each call the loop projects the call's tokens (the last prompt plus what
was added since, plus the call's completion limit) and its cost (at the spend per token so far).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from backends.embeddings.base import Embedder
from backends.llm.base import LLM, Completion, Message, Tier, ToolCall, Usage
from backends.retrieval.base import Retriever
from routers.agent_tools import TOOL_SPECS, AgentTools, SourceBook, ToolLimits, ToolResult
from routers.generation import NOT_FOUND, finish, with_usage
from routers.prompts import AGENT_FINAL, AGENT_SYSTEM
from routers.types import AgentStep, Answer, Citation, Generation, Route, RouteContext

# A rough, deliberately high estimate for text not yet counted by the upstream.
_CHARS_PER_TOKEN = 3
_BEST_PASSAGES = 3


class AgentConfig(BaseModel):
    """The `agent:` section: the loop's hard caps and its tools' limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int = Field(default=4, ge=1, le=20, description="model turns that may use tools")
    max_tool_calls: int = Field(default=12, ge=1, le=100)
    max_tokens: int = Field(default=24_000, ge=100, description="prompt + completion, all calls")
    deadline_s: float = Field(default=30.0, gt=0)
    max_cost_usd: float = Field(default=0.10, ge=0)
    # Completion limit of each turn; the final answer uses the tier's own max_tokens.
    step_max_tokens: int = Field(default=512, ge=16)
    # Share of the deadline kept for the forced final answer.
    final_share: float = Field(default=0.25, gt=0, lt=1)
    tool_timeout_s: float = Field(default=5.0, gt=0)
    search_k: int = Field(default=6, ge=1, le=10)
    read_max_chunks: int = Field(default=4, ge=1, le=20)
    min_similarity: float = Field(default=0.3, ge=-1, le=1)


@dataclass(frozen=True, slots=True)
class AgentDeps:
    llm: LLM
    retriever: Retriever
    embedder: Embedder
    # Called for every model call the loop makes, so each is counted and costed.
    record: Callable[[Completion, str], None]
    candidates: int = 50


class MultihopExecutor:
    def __init__(self, deps: AgentDeps, config: AgentConfig, tier: Tier) -> None:
        self._deps = deps
        self._config = config
        self._tier = tier
        self._limits = ToolLimits(
            search_k=config.search_k,
            max_k=10,
            candidates=deps.candidates,
            read_max_chunks=config.read_max_chunks,
            timeout_s=config.tool_timeout_s,
            min_similarity=config.min_similarity,
        )

    async def __call__(self, ctx: RouteContext) -> Answer | Generation:
        book = SourceBook()
        tools = AgentTools(
            ctx.tenant, self._deps.retriever, self._deps.embedder, self._limits, book
        )
        return await _Run(self._deps, self._config, self._tier, ctx, tools, book).execute()


@dataclass(slots=True)
class _Budget:
    config: AgentConfig
    started: float
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    last_prompt_tokens: int = 0
    # Characters appended to the conversation since the last call was counted.
    pending_chars: int = 0

    def charge(self, usage: Usage) -> None:
        self.steps += 1
        self.tokens += usage.prompt_tokens + usage.completion_tokens
        self.cost_usd += usage.cost_usd
        self.last_prompt_tokens = usage.prompt_tokens
        self.pending_chars = 0

    def projected_tokens(self, completion_limit: int) -> int:
        return self.last_prompt_tokens + self.pending_chars // _CHARS_PER_TOKEN + completion_limit

    def affordable(self, completion_limit: int) -> str | None:
        """The cap the next call could break, or None."""
        projected = self.projected_tokens(completion_limit)
        if self.tokens + projected > self.config.max_tokens:
            return "tokens"
        per_token = self.cost_usd / self.tokens if self.tokens else 0.0
        if self.cost_usd + projected * per_token > self.config.max_cost_usd:
            return "cost"
        return None

    def cap_reached(self) -> str | None:
        if self.steps >= self.config.max_steps:
            return "steps"
        if self.tool_calls >= self.config.max_tool_calls:
            return "tool_calls"
        return self.affordable(self.config.step_max_tokens)


@dataclass(slots=True)
class _Run:
    deps: AgentDeps
    config: AgentConfig
    tier: Tier
    ctx: RouteContext
    tools: AgentTools
    book: SourceBook
    messages: list[Message] = field(default_factory=list)
    steps: list[AgentStep] = field(default_factory=list)
    usage: dict[str, Usage] = field(default_factory=dict)
    budget: _Budget = field(init=False)

    def __post_init__(self) -> None:
        self.budget = _Budget(self.config, time.monotonic())
        self.messages = [
            Message("system", AGENT_SYSTEM),
            *self.ctx.history,
            Message("user", self.ctx.query),
        ]
        self.budget.pending_chars = sum(len(m.content) for m in self.messages)

    async def execute(self) -> Answer | Generation:
        loop_s = self.config.deadline_s * (1 - self.config.final_share)
        cap: str | None = None
        try:
            async with asyncio.timeout(loop_s):
                while (cap := self.budget.cap_reached()) is None:
                    answer = await self._step()
                    if answer is not None:
                        return answer
        except TimeoutError:
            cap = "deadline"
        return self._at_cap(cap)

    async def _step(self) -> Answer | None:
        started = time.perf_counter()
        completion = await self.deps.llm.complete(
            self.tier,
            list(self.messages),
            tools=TOOL_SPECS,
            max_tokens=self.config.step_max_tokens,
            route=Route.MULTIHOP.value,
        )
        self.deps.record(completion, Route.MULTIHOP.value)
        model_ms = round((time.perf_counter() - started) * 1000, 3)
        if not completion.tool_calls:
            self.steps.append(AgentStep(self.tier, completion.model, completion.usage, model_ms))
            return finish(self._generation(self.messages), completion)
        self._charge(completion)
        results = await self._run_tools(completion.tool_calls)
        step = AgentStep(
            self.tier, completion.model, completion.usage, model_ms, tuple(r.run for r in results)
        )
        self.steps.append(step)
        self._append(Message("assistant", completion.text, tool_calls=completion.tool_calls))
        for call, result in zip(completion.tool_calls, results, strict=True):
            self._append(Message("tool", result.content, tool_call_id=call.id))
        return None

    async def _run_tools(self, calls: tuple[ToolCall, ...]) -> list[ToolResult]:
        allowed = max(self.config.max_tool_calls - self.budget.tool_calls, 0)
        self.budget.tool_calls += min(len(calls), allowed)
        ran = await asyncio.gather(*(self.tools.run(c) for c in calls[:allowed]))
        return [*ran, *(self.tools.refused(c, "the tool-call cap") for c in calls[allowed:])]

    def _charge(self, completion: Completion) -> None:
        self.budget.charge(completion.usage)
        self.usage = with_usage(self.usage, {completion.tier: completion.usage})

    def _append(self, message: Message) -> None:
        self.messages.append(message)
        self.budget.pending_chars += len(message.content) + sum(
            len(str(c.arguments)) for c in message.tool_calls
        )

    def _generation(
        self, messages: list[Message], cap: str | None = None, timeout_s: float | None = None
    ) -> Generation:
        escalation = self.ctx.escalation
        return Generation(
            route=Route.MULTIHOP,
            tier=self.tier,
            messages=tuple(messages),
            sources=tuple(self.book.citations),
            usage_by_tier=dict(self.usage),
            steps=tuple(self.steps),
            escalation_reason=escalation.reason if escalation else None,
            notes=self._notes(cap),
            timeout_s=timeout_s,
            cap=cap,
        )

    def _notes(self, cap: str | None) -> tuple[str, ...]:
        escalation = self.ctx.escalation
        notes = (escalation.note,) if escalation else ()
        return (*notes, f"the agent stopped at its {cap} cap") if cap else notes

    def _at_cap(self, cap: str) -> Answer | Generation:
        if not self.book.citations:
            return self._plain(
                f"{NOT_FOUND} The searches found no relevant passage before the {cap} cap.", cap
            )
        remaining = self.config.deadline_s - (time.monotonic() - self.budget.started)
        unaffordable = self.budget.affordable(0) if cap != "deadline" else None
        if cap in ("tokens", "cost") or unaffordable is not None or remaining <= 0:
            return self._plain(
                f"Stopped at the {cap} cap before an answer could be written; the most relevant "
                "passages found are cited.",
                cap,
                tuple(self.book.citations[:_BEST_PASSAGES]),
            )
        final = [*self.messages, Message("system", AGENT_FINAL)]
        return self._generation(final, cap=cap, timeout_s=remaining)

    def _plain(self, text: str, cap: str, citations: tuple[Citation, ...] = ()) -> Answer:
        escalation = self.ctx.escalation
        return Answer(
            text=text,
            route=Route.MULTIHOP,
            citations=citations,
            usage_by_tier=dict(self.usage),
            complete=False,
            escalated=escalation is not None,
            escalation_reason=escalation.reason if escalation else None,
            notes=self._notes(cap),
            steps=tuple(self.steps),
            cap=cap,
        )
