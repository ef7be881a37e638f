"""`POST /v1/chat/completions`: OpenAI's wire format in and out, querygate's routing inside.

`model` picks the route ("auto" classifies; "direct", "lookup" or "multihop" force one, where
this deployment can execute it: the names `GET /v1/models` lists). The last user message is
the query, earlier messages the history. Route, citations and cost come back in an extra
`querygate` field that OpenAI clients ignore. Every OpenAI parameter is honoured or refused
with 400 naming it (gateway/chat_params.py); client tools' calls come back in OpenAI's shape.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from backends.llm.base import NO_OPTIONS, Message, ToolCall
from gateway.accounting import current_record
from gateway.appkeys import RUNTIME
from gateway.chat_params import generation_options, refuse_unsupported
from gateway.errors import BadRequest, Unprocessable
from gateway.handlers import answer, cache_control, check_limits, parse_body
from gateway.models_endpoint import deployment_models, model_not_found
from gateway.pipeline import QueryRequest
from gateway.schemas import ChatBody, ChatMessage
from gateway.streaming import sse, stream_answer
from gateway.wire import QueryResult, rewrite_fields
from routers.generation import usage_total

_HISTORY_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def split_messages(messages: list[ChatMessage]) -> tuple[str, tuple[Message, ...]]:
    """(query, history): the last message must be the user's question."""
    for i, m in enumerate(messages):
        # A conversation that goes on with tool results cannot be routed as a question yet;
        # refused rather than answered without them.
        if m.role == "tool" or (m.model_extra or {}).get("tool_calls"):
            raise BadRequest(
                f"messages.{i}: tool calls and tool results cannot be sent back; the gateway "
                "returns a model's tool calls but does not continue a conversation with their "
                "results"
            )
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


def tool_calls_body(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """The model's calls of the client's tools, in OpenAI's shape."""
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in calls
    ]


def message_body(result: QueryResult) -> dict[str, Any]:
    answer = result.answer
    if not answer.tool_calls:
        return {"role": "assistant", "content": answer.text}
    calls = tool_calls_body(answer.tool_calls)
    return {"role": "assistant", "content": answer.text or None, "tool_calls": calls}


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
        out = b""
        if calls := tool_calls_body(result.answer.tool_calls):
            # whole calls in one delta (OpenAI streams them in pieces; clients join either)
            pieces = [{"index": i, **call} for i, call in enumerate(calls)]
            choice = {"index": 0, "delta": {"tool_calls": pieces}, "finish_reason": None}
            out += sse(self._chunk([choice]))
        finish = {"index": 0, "delta": {}, "finish_reason": result.answer.finish_reason}
        out += sse(self._chunk([finish], querygate=extension(result)))
        if self._include_usage:
            out += sse(self._chunk([], usage=usage_block(result)))
        return out + sse("[DONE]")

    def error(self, kind: str, message: str) -> bytes:
        return sse({"error": {"type": kind, "message": message}}) + sse("[DONE]")


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    body = await parse_body(request, ChatBody)
    if body.model not in (models := deployment_models(runtime)):
        raise model_not_found(body.model, models)
    refuse_unsupported(body)
    options = generation_options(body)
    query_text, history = split_messages(body.messages)
    check_limits(runtime, query_text, len(history))
    lookup, store = cache_control(request)
    if options is not NO_OPTIONS:
        # an answer to the client's own parameters: not the cache's to give, nor to keep
        lookup = store = False
    if (record := current_record.get()) is not None and (body.user or body.safety_identifier):
        record.fields["user"] = body.user or body.safety_identifier
    query = QueryRequest(
        id=request["request_id"],
        tenant=tenant,
        query=query_text,
        history=history,
        route=body.model,
        cache_lookup=lookup,
        cache_store=store,
        options=options,
    )
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
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
                    "message": message_body(result),
                    "finish_reason": result.answer.finish_reason,
                }
            ],
            "usage": usage_block(result),
            "querygate": extension(result),
        }
    )
