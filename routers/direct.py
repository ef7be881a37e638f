"""The direct route: no retrieval, the small model answers from the conversation alone."""

from __future__ import annotations

from backends.llm.base import Message, Tier
from routers.prompts import DIRECT_SYSTEM
from routers.types import Answer, Generation, Route, RouteContext

NO_MODEL_TEXT = (
    "No language model is configured, so this gateway answers only from its documents. "
    "Ask a question about them."
)


class DirectExecutor:
    def __init__(self, tier: Tier | None) -> None:
        self._tier = tier  # None: no model configured

    async def __call__(self, ctx: RouteContext) -> Answer | Generation:
        if self._tier is None:
            return Answer(text=NO_MODEL_TEXT, route=Route.DIRECT, extractive=True, complete=False)
        messages = (Message("system", DIRECT_SYSTEM), *ctx.history, Message("user", ctx.query))
        return Generation(route=Route.DIRECT, tier=self._tier, messages=messages)
