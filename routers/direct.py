"""The direct route: no retrieval, the small model answers from the conversation alone.

Without a model, small talk (`routers.small_talk`) gets a short reply saying what this
gateway can do (cut to `max_tokens`, as an extractive answer is), and any other question that
reaches the route (forced, or sent by a configured rule) is answered from the documents by the
lookup route, which says so: a fixed sentence would answer none of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from backends.llm.base import Message, Tier
from routers.extractive import fit_tokens
from routers.prompts import DIRECT_SYSTEM
from routers.small_talk import small_talk
from routers.types import Answer, Escalation, Generation, OptionNotHonoured, Route, RouteContext

NO_MODEL_TEXT = (
    "No language model is configured, so this gateway answers only from its documents. "
    "Ask a question about them."
)
LOOKED_UP = "no model is configured for the direct route and this is not small talk: looked up"

Lookup = Callable[[RouteContext], Awaitable[Answer | Generation | Escalation]]


class DirectExecutor:
    def __init__(self, tier: Tier | None, lookup: Lookup, count: Callable[[str], int]) -> None:
        self._tier = tier  # None: no model configured
        self._lookup = lookup  # answers what needs a model when there is none
        self._count = count  # tokens, as the extractive answers' `max_tokens` counts them

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        if self._tier is None:
            if wanted := model_only_params(ctx):
                raise OptionNotHonoured(f"{wanted}: no model is configured for the direct route")
            if small_talk(ctx.query) is None:
                return _noted(await self._lookup(ctx), LOOKED_UP)
            return self._no_model_reply(ctx.options.max_tokens)
        messages = (
            Message("system", DIRECT_SYSTEM),
            *ctx.history,
            Message("user", ctx.query),
            *ctx.trailing,
        )
        return Generation(
            route=Route.DIRECT, tier=self._tier, messages=messages, options=ctx.options
        )

    def _no_model_reply(self, max_tokens: int | None) -> Answer:
        """The fixed reply, cut to the client's `max_tokens` as an extractive answer is."""
        if max_tokens is None or self._count(NO_MODEL_TEXT) <= max_tokens:
            return Answer(NO_MODEL_TEXT, Route.DIRECT, extractive=True, complete=False)
        return Answer(
            fit_tokens(NO_MODEL_TEXT, max_tokens, self._count),
            Route.DIRECT,
            extractive=True,
            complete=False,
            notes=(f"the reply was cut to max_tokens {max_tokens}",),
            finish_reason="length",
        )


def model_only_params(ctx: RouteContext) -> str:
    """What the request asks that only the direct route's model call can honour (it answers
    from the conversation alone; every other route writes prose that cites sources): the
    parameters set, comma-joined, and `messages` for a conversation with tool calls."""
    options = ctx.options
    wanted = {
        "messages": ctx.has_tool_messages,
        "tools": bool(options.tools),
        "tool_choice": options.tool_choice is not None,
        "parallel_tool_calls": options.parallel_tool_calls is not None,
        "response_format": options.response_format is not None,
    }
    return ", ".join(name for name, asked in wanted.items() if asked)


def _noted(
    outcome: Answer | Generation | Escalation, note: str
) -> Answer | Generation | Escalation:
    if isinstance(outcome, Escalation):
        return replace(outcome, note=f"{note}; {outcome.note}")
    return replace(outcome, notes=(note, *outcome.notes))
