"""The direct route: no retrieval, the small model answers from the conversation alone.

Without a model, small talk (`routers.small_talk`) gets a short reply saying what this
gateway can do, and any other question that reaches the route (forced, or sent by a
configured rule) is answered from the documents by the lookup route, which says so: a fixed
sentence would answer none of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from backends.llm.base import Message, Tier
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
    def __init__(self, tier: Tier | None, lookup: Lookup) -> None:
        self._tier = tier  # None: no model configured
        self._lookup = lookup  # answers what needs a model when there is none

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        if self._tier is None:
            if wanted := model_only_params(ctx):
                raise OptionNotHonoured(f"{wanted}: no model is configured for the direct route")
            if small_talk(ctx.query) is None:
                return _noted(await self._lookup(ctx), LOOKED_UP)
            return Answer(text=NO_MODEL_TEXT, route=Route.DIRECT, extractive=True, complete=False)
        messages = (
            Message("system", DIRECT_SYSTEM),
            *ctx.history,
            Message("user", ctx.query),
            *ctx.trailing,
        )
        return Generation(
            route=Route.DIRECT, tier=self._tier, messages=messages, options=ctx.options
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
