"""`POST /v1/chat/completions`: OpenAI's wire format in and out, querygate's routing inside.

`model` picks the route ("auto" classifies; "direct", "lookup" or "multihop" force one). The
last user message is the query, earlier messages the history. Route, citations and cost come
back in an extra `querygate` field that OpenAI clients ignore.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from backends.llm.base import Message
from gateway.appkeys import RUNTIME
from gateway.errors import NotFound, Unprocessable
from gateway.handlers import answer, cache_control, check_limits, parse_body
from gateway.pipeline import QueryRequest
from gateway.schemas import ChatBody, ChatMessage
from gateway.streaming import sse, stream_answer
from gateway.wire import QueryResult, rewrite_fields
from routers.generation import usage_total

MODELS = ("auto", "direct", "lookup", "multihop")
_HISTORY_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def split_messages(messages: list[ChatMessage]) -> tuple[str, tuple[Message, ...]]:
    """(query, history): the last message must be the user's question."""
    last = messages[-1]
    if last.role != "user" or not last.text().strip():
        raise Unprocessable("messages: the last message must be a non-empty user message")
    history = tuple(
        Message(_HISTORY_ROLES[m.role], m.text())  # type: ignore[arg-type]
        for m in messages[:-1]
        if m.role in _HISTORY_ROLES
    )
    return last.text(), history


def extension(result: QueryResult) -> dict[str, Any]:
    a = result.answer
    return {
        "id": result.id,
        "route": a.route.value,
        "route_reason": result.route_reason,
        "escalated": a.escalated,
        "extractive": a.extractive,
        "citations": [asdict(c) for c in a.citations],
        "cache": result.cache,
        "cost_usd": round(usage_total(a).cost_usd, 8),
        "timings_ms": result.timings_ms,
        "config_version": result.config_version,
        **rewrite_fields(result),
    }


def usage_block(result: QueryResult) -> dict[str, int]:
    total = usage_total(result.answer)
    return {
        "prompt_tokens": total.prompt_tokens,
        "completion_tokens": total.completion_tokens,
        "total_tokens": total.prompt_tokens + total.completion_tokens,
    }


class ChatStreamFormat:
    """OpenAI `chat.completion.chunk` events, closed by `data: [DONE]`."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self._id = f"chatcmpl-{request_id}"
        self._model = model
        self._created = int(time.time())
        self._include_usage = include_usage

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            **extra,
        }

    def opening(self) -> bytes:
        delta = {"role": "assistant", "content": ""}
        return sse(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]))

    def delta(self, text: str) -> bytes:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        return sse(self._chunk([choice]))

    def done(self, result: QueryResult) -> bytes:
        final = self._chunk(
            [{"index": 0, "delta": {}, "finish_reason": "stop"}], querygate=extension(result)
        )
        out = sse(final)
        if self._include_usage:
            out += sse(self._chunk([], usage=usage_block(result)))
        return out + sse("[DONE]")

    def error(self, kind: str, message: str) -> bytes:
        return sse({"error": {"type": kind, "message": message}}) + sse("[DONE]")


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    body = await parse_body(request, ChatBody)
    if body.model not in MODELS:
        raise NotFound(f"model {body.model!r} does not exist; use one of {', '.join(MODELS)}")
    query_text, history = split_messages(body.messages)
    check_limits(runtime, query_text, len(history))
    lookup, store = cache_control(request)
    query = QueryRequest(
        id=request["request_id"],
        tenant=tenant,
        query=query_text,
        history=history,
        route=body.model,
        cache_lookup=lookup,
        cache_store=store,
    )
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        fmt = ChatStreamFormat(query.id, body.model, include_usage)
        return await stream_answer(request, runtime, query, fmt)
    result = await answer(runtime, query)
    return web.json_response(
        {
            "id": f"chatcmpl-{query.id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.answer.text},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage_block(result),
            "querygate": extension(result),
        }
    )
