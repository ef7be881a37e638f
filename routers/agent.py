"""The multihop route: a bounded agent loop on the large tier.

One `_Run` per request. Each iteration first checks every cap, then makes one model turn with
the `search` and `read` tools; the tool calls of a turn run concurrently. The loop ends when
the model answers in plain text (citing the sources with the markers issued for them), or at
a cap:
- steps, tool calls or the deadline: one last call, without tools, answers from the passages
  found (as a lookup answers from its passages); the loop gets `deadline_s * (1 - final_share)`,
  that call the rest, and if it cannot finish in time the plain answer below is given instead
  (if its model fails, the best passages found are quoted, marked degraded);
- tokens or cost, or a final call that could break them: no call is made and the answer says
  plainly where it stopped, citing the best-scored passages found.
With nothing relevant found, the answer says the documents do not contain it.

A turn whose model fails (its tier's retries and fallbacks spent) after searches found passages
degrades instead of failing the request: one call without tools on the degraded tier (the lookup
route's small model) answers from those passages, under what the caps leave; where no call may
be made (no such tier, a cap, or that call fails too) the best passages' snippets are quoted
verbatim. Either way the answer is marked (`Answer.degraded`, a note)
and never cached. With nothing found yet, or a refusal the client's own parameters caused, the
failure stands.

Caps are hard: before each call the loop projects its tokens (the last prompt plus what was
added since, plus the call's completion limit) and prices them at the tier's dearest rates.

Over 400 lines because the loop, its caps' final call and its degraded answers share one `_Run`
state; the caps' arithmetic (agent_caps) and the tools (agent_tools) live apart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from backends.embeddings.base import Embedder
from backends.errors import BackendError
from backends.llm.base import LLM, Completion, LLMCall, Message, Tier, ToolCall, Usage
from backends.retrieval.base import FusionMethod, Retriever
from routers.agent_caps import CHARS_PER_TOKEN, AgentConfig, Budget
from routers.agent_tools import (
    TOOL_SPECS,
    AgentTools,
    SearchRerank,
    SourceBook,
    ToolLimits,
    ToolResult,
)
from routers.extractive import extractive_text
from routers.generation import NOT_FOUND, clients_fault, failure_kind, finish, with_usage
from routers.prompts import AGENT_FINAL, AGENT_SYSTEM, format_sources
from routers.rerank import RERANK_OFF, RerankStage
from routers.types import (
    AgentStep,
    Answer,
    Cap,
    Citation,
    Generation,
    Route,
    RouteContext,
    SpanOpener,
    no_span,
)

_TOOL_SPEC_CHARS = len(json.dumps(TOOL_SPECS))
_BEST_PASSAGES = 3

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentDeps:
    llm: LLM
    retriever: Retriever
    embedder: Embedder
    candidates: int = 50
    # The usage of a call the deadline cut before it answered (its prompt), as the gateway's
    # metering and budgets charge it; None: the loop's own projection.
    estimate: Callable[[Tier, Sequence[Message]], Usage] | None = None
    # The second stage of every retrieval (the lookup's and the `search` tool's), one policy.
    rerank: RerankStage = RERANK_OFF
    # The `search` tool's fusion, as the lookup's (`LookupParams.fusion`).
    fusion: FusionMethod | None = None
    # Each step and tool call a span of the request's trace.
    span: SpanOpener = no_span


class MultihopExecutor:
    def __init__(
        self, deps: AgentDeps, config: AgentConfig, tier: Tier, degraded_tier: Tier | None = None
    ) -> None:
        self._deps = deps
        self._config = config
        self._tier = tier
        # Writes the answer from the passages found when `tier` fails mid-loop; None: quoted.
        self._degraded_tier = degraded_tier if degraded_tier != tier else None
        self._limits = ToolLimits(
            search_k=config.search_k,
            candidates=deps.candidates,
            read_max_chunks=config.read_max_chunks,
            timeout_s=config.tool_timeout_s,
            min_similarity=config.min_similarity,
            fusion=deps.fusion,
        )

    async def __call__(self, ctx: RouteContext) -> Answer | Generation:
        book = SourceBook()
        tools = AgentTools(
            ctx.tenant,
            self._deps.retriever,
            self._deps.embedder,
            self._limits,
            book,
            SearchRerank(self._deps.rerank, ctx.reranks, ctx.deadline),
            groups=ctx.groups,
            span=self._deps.span,
        )
        run = _Run(self._deps, self._config, self._tier, ctx, tools, book, self._degraded_tier)
        return await run.execute()


@dataclass(slots=True)
class _Run:
    deps: AgentDeps
    config: AgentConfig
    tier: Tier
    ctx: RouteContext
    tools: AgentTools
    book: SourceBook
    degraded_tier: Tier | None = None
    messages: list[Message] = field(default_factory=list)
    steps: list[AgentStep] = field(default_factory=list)
    usage: dict[str, Usage] = field(default_factory=dict)
    budget: Budget = field(init=False)

    usage_estimated: bool = False
    # The prompt of the model call in flight, until it answers.
    calling: list[Message] | None = None

    @property
    def llm(self) -> LLM:
        """Where the loop's model calls go: the request's own view of the seam, if it has one."""
        return self.ctx.llm if self.ctx.llm is not None else self.deps.llm

    def __post_init__(self) -> None:
        prices = self.deps.llm.prices(self.tier)
        self.budget = Budget(self.config, prices, time.monotonic())
        self.messages = [
            Message("system", AGENT_SYSTEM.format(tag=self.book.tag)),
            *self.ctx.history,
            Message("user", self.ctx.query),
        ]
        chars = sum(len(m.content) for m in self.messages)
        self.budget.pending_chars = chars + _TOOL_SPEC_CHARS

    async def execute(self) -> Answer | Generation:
        loop_s = self.config.deadline_s * (1 - self.config.final_share)
        cap: Cap | None = None
        try:
            async with asyncio.timeout(loop_s):
                while (cap := self.budget.cap_reached()) is None:
                    answer = await self._step()
                    if answer is not None:
                        return answer
        except TimeoutError:
            cap = "deadline"
            self._charge_cut()
        except BackendError as exc:
            self.calling = None  # failed with nothing answered: not charged (as budgets do)
            if not self.book.citations or clients_fault(exc, self.ctx.options):
                raise
            return await self._degraded(exc)
        return self._at_cap(cap)

    async def _step(self) -> Answer | None:
        with self.deps.span("agent_step", {"querygate.agent.step": len(self.steps) + 1}):
            return await self._turn()

    async def _turn(self) -> Answer | None:
        started = time.perf_counter()
        self.calling = list(self.messages)
        completion = await self.llm.complete(
            LLMCall(
                self.tier,
                tuple(self.calling),
                tools=TOOL_SPECS,
                max_tokens=self.config.step_max_tokens,
                route=Route.MULTIHOP.value,
                # every turn may write the answer, so every turn takes the client's parameters
                options=self.ctx.options,
            )
        )
        self.calling = None
        self.usage_estimated |= completion.usage_estimated
        model_ms = round((time.perf_counter() - started) * 1000, 3)
        if not completion.tool_calls:
            self.steps.append(AgentStep(self.tier, completion.model, completion.usage, model_ms))
            return finish(self._generation(self.messages), completion)
        self._charge(completion)
        self.budget.tool_turns += 1
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
        self._charge_usage(completion.usage)

    def _charge_usage(self, usage: Usage, tier: Tier | None = None) -> None:
        self.budget.charge(usage)
        self.usage = with_usage(self.usage, {tier or self.tier: usage})

    def _charge_cut(self, tier: Tier | None = None) -> None:
        """The call the deadline cut: its prompt may be billed, and the gateway charged the
        tenant for it, so the caps after it and the answer's usage count it too."""
        if self.calling is None:
            return
        prompt, self.calling = self.calling, None
        tier = tier or self.tier
        if self.deps.estimate is not None:
            usage = self.deps.estimate(tier, prompt)
        else:
            tokens = sum(len(m.content) for m in prompt) // CHARS_PER_TOKEN
            if tier == self.tier:
                tokens = self.budget.next_prompt_tokens()
            usage = Usage(tokens, 0, tokens * self.deps.llm.prices(tier)[0])
        self._charge_usage(usage, tier)
        self.usage_estimated = True

    def _append(self, message: Message) -> None:
        self.messages.append(message)
        # The arguments as the next prompt carries them: verbatim when the model wrote
        # something that is not JSON (then `arguments` is empty).
        self.budget.pending_chars += len(message.content) + sum(
            len(c.name)
            + len(c.raw_arguments if c.raw_arguments is not None else json.dumps(c.arguments))
            for c in message.tool_calls
        )

    def _generation(
        self, messages: list[Message], cap: Cap | None = None, timeout_s: float | None = None
    ) -> Generation:
        escalation = self.ctx.escalation
        return Generation(
            route=Route.MULTIHOP,
            tier=self.tier,
            messages=tuple(messages),
            sources=tuple(self.book.citations),
            source_tag=self.book.tag,
            usage_by_tier=dict(self.usage),
            steps=tuple(self.steps),
            escalation_reason=escalation.reason if escalation else None,
            notes=self._notes(cap),
            timeout_s=timeout_s,
            cap=cap,
            max_tokens=self.config.step_max_tokens,
            usage_estimated=self.usage_estimated,
            fallback=self._stopped(cap) if cap else None,
            on_failure=self._failed_at(cap) if cap else None,
            options=self.ctx.options,
        )

    def _failed_at(self, cap: Cap) -> Answer:
        """The answer if the final call at a cap fails (the pipeline makes it, and logs it)."""
        note = (
            f"degraded: the {self.tier} tier failed writing the answer at the {cap} cap; "
            "the best passages found are quoted"
        )
        return self._quoted_answer(note, cap)

    def _notes(self, cap: Cap | None) -> tuple[str, ...]:
        escalation = self.ctx.escalation
        notes = (escalation.note,) if escalation else ()
        return (*notes, f"the agent stopped at its {cap} cap") if cap else notes

    def _at_cap(self, cap: Cap) -> Answer | Generation:
        if not self.book.citations:
            return self._plain(
                f"{NOT_FOUND} The searches found no relevant passage before the {cap} cap.", cap
            )
        final = self._final_messages()
        prompt_tokens = sum(len(m.content) for m in final) // CHARS_PER_TOKEN
        remaining = self.config.deadline_s - (time.monotonic() - self.budget.started)
        if cap in ("tokens", "cost") or remaining <= 0:
            return self._stopped(cap)
        if (unaffordable := self.budget.breaks(prompt_tokens)) is not None:
            return self._stopped(cap, unaffordable)
        return self._generation(final, cap=cap, timeout_s=remaining)

    def _final_messages(self) -> list[Message]:
        """The passages found, under the markers the loop issued, and the question: no tool
        messages, so any provider takes them and the model has nothing left to call."""
        tag = self.book.tag
        passages = format_sources(tag, self.book.passages)
        return [
            Message("system", AGENT_FINAL.format(tag=tag, sources=passages)),
            *self.ctx.history,
            Message("user", self.ctx.query),
        ]

    def _stopped(self, cap: Cap, unaffordable: Cap | None = None) -> Answer:
        """The plain answer at a cap: where it stopped, citing the best-scored passages."""
        why = f"the {cap} cap" + (
            f" (a final answer could pass the {unaffordable} cap)" if unaffordable else ""
        )
        best = sorted(self.book.citations, key=lambda c: -c.score)[:_BEST_PASSAGES]
        return self._plain(
            f"Stopped at {why} before an answer could be written; the best-scored passages "
            "found are cited.",
            cap,
            tuple(best),
        )

    async def _degraded(self, failure: BackendError) -> Answer:
        """The loop's model failed with passages found: the degraded tier answers from them in
        one call the caps allow, else they are quoted."""
        why = failure_kind(failure)
        tier = self.degraded_tier
        final = self._final_messages()
        prompt_tokens = sum(len(m.content) for m in final) // CHARS_PER_TOKEN
        remaining = self.config.deadline_s - (time.monotonic() - self.budget.started)
        if tier is None:
            return self._quoted(failure, why, "no other tier answers from passages")
        if remaining <= 0:
            return self._quoted(failure, why, "no time is left for another call")
        prices = self.deps.llm.prices(tier)
        if (unaffordable := self.budget.breaks(prompt_tokens, prices)) is not None:
            return self._quoted(failure, why, f"another call could pass the {unaffordable} cap")
        self.calling = final
        try:
            async with asyncio.timeout(remaining):
                completion = await self.llm.complete(
                    LLMCall(
                        tier,
                        tuple(final),
                        max_tokens=self.config.step_max_tokens,
                        route=Route.MULTIHOP.value,
                        options=self.ctx.options,
                    )
                )
        except TimeoutError:
            self._charge_cut(tier)
            return self._quoted(failure, why, f"the {tier} tier did not answer in time")
        except BackendError as again:
            self.calling = None
            also = f"the {tier} tier failed too ({failure_kind(again)})"
            return self._quoted(failure, why, also)
        self.calling = None
        note = (
            f"degraded: the {self.tier} tier failed mid-loop ({why}); the {tier} tier answered "
            f"from the {len(self.book.citations)} passage(s) found"
        )
        self._log_degraded(failure, "fallback_tier")
        generation = replace(self._generation(final), tier=tier, notes=(*self._notes(None), note))
        # Not the answer the loop would have written: never cached (`complete` false).
        return replace(finish(generation, completion), complete=False, degraded="fallback_tier")

    def _quoted(self, failure: BackendError, why: str, because: str) -> Answer:
        """The best passages found, their snippets verbatim and cited (`extractive_text`)."""
        self._log_degraded(failure, "extractive")
        return self._quoted_answer(
            f"degraded: the {self.tier} tier failed mid-loop ({why}) and {because}; "
            "the best passages found are quoted",
            None,
        )

    def _quoted_answer(self, note: str, cap: Cap | None) -> Answer:
        best = tuple(sorted(self.book.citations, key=lambda c: -c.score)[:_BEST_PASSAGES])
        answer = self._plain(extractive_text(best), cap, best)
        return replace(answer, notes=(*answer.notes, note), extractive=True, degraded="extractive")

    def _log_degraded(self, failure: BackendError, how: str) -> None:
        log.warning(
            "agent degraded: its model failed mid-loop",
            extra={
                "tenant": self.ctx.tenant,
                "tier": self.tier,
                "degraded": how,
                "passages": len(self.book.citations),
                "error": str(failure),
            },
        )

    def _plain(self, text: str, cap: Cap | None, citations: tuple[Citation, ...] = ()) -> Answer:
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
            usage_estimated=self.usage_estimated,
        )
