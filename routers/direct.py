"""The direct route: no retrieval, the small model answers from the conversation alone."""

from __future__ import annotations

from backends.llm.base import Message, Tier
from routers.prompts import DIRECT_SYSTEM
from routers.types import Answer, Generation, OptionNotHonoured, Route, RouteContext

NO_MODEL_TEXT = (
    "No language model is configured, so this gateway answers only from its documents. "
    "Ask a question about them."
)


class DirectExecutor:
    def __init__(self, tier: Tier | None) -> None:
        self._tier = tier  # None: no model configured

    async def __call__(self, ctx: RouteContext) -> Answer | Generation:
        if self._tier is None:
            if wanted := model_only_params(ctx):
                raise OptionNotHonoured(f"{wanted}: no model is configured for the direct route")
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
