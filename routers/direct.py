"""The direct route: no retrieval, the small model answers from the conversation alone."""

from __future__ import annotations

from backends.llm.base import Message
from routers.prompts import DIRECT_SYSTEM
from routers.types import Answer, Generation, Route, RouteContext

NO_MODEL_TEXT = (
    "No language model is configured, so this gateway answers only from its documents. "
    "Ask a question about them."
)


def plan_direct(ctx: RouteContext, has_model: bool) -> Answer | Generation:
    if not has_model:
        return Answer(text=NO_MODEL_TEXT, route=Route.DIRECT, extractive=True, complete=False)
    messages = (Message("system", DIRECT_SYSTEM), *ctx.history, Message("user", ctx.query))
    return Generation(route=Route.DIRECT, tier="small", messages=messages)
