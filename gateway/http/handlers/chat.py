"""`POST /v1/chat/completions`: OpenAI's wire format in and out, querygate's routing inside.

`model` picks the route ("auto" classifies; "direct", "lookup" or "multihop" force one, where
this deployment can execute it: the names `GET /v1/models` lists). The last user message is
the query, earlier messages the history. Route, citations and cost come back in an extra
`querygate` field that OpenAI clients ignore. Every OpenAI parameter is honoured or refused
with 400 naming it (gateway/http/chat_params.py); client tools' calls come back in OpenAI's
shape.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any, Literal

from aiohttp import web

from backends.llm.base import NO_OPTIONS, Message, ToolCall
from gateway.core.request import QueryRequest
from gateway.core.result import QueryResult, partial_fields, rewrite_fields
from gateway.errors import Unprocessable
from gateway.http.appkeys import REQUEST_ID, RUNTIME, SCOPE
from gateway.http.body import parse_body
from gateway.http.chat_params import generation_options, refuse_unsupported
from gateway.http.handlers.models import deployment_models, model_not_found
from gateway.http.handlers.query import answer, cache_control, check_limits
from gateway.http.schemas import ChatBody, ChatMessage
from gateway.http.streaming import sse, stream_answer
from gateway.http.wire import partial_headers
from gateway.text import is_blank
from routers.generation import usage_total

_ROLES: dict[str, Literal["system", "user", "assistant", "tool"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def split_messages(
    messages: list[ChatMessage],
) -> tuple[str, tuple[Message, ...], tuple[Message, ...]]:
    """(query, history, trailing): the question is the last user message; after it may come
    only the model's calls of the client's tools and their results, ending with a result."""
    asked = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if asked is None or is_blank(messages[asked].text()) or not _tool_turns(messages[asked + 1 :]):
        raise Unprocessable(
            "messages: the last message must be a non-empty user message, or the results of "
            "the tools the model called after it"
        )
    history = tuple(_message(m) for m in messages[:asked])
    trailing = tuple(_message(m) for m in messages[asked + 1 :])
    return messages[asked].text(), history, trailing


def _tool_turns(tail: list[ChatMessage]) -> bool:
    """Nothing, or the model's tool calls and their results, ending with a result."""
    if not tail:
        return True
    turns = all(m.role == "tool" or (m.role == "assistant" and m.tool_calls) for m in tail)
    return turns and tail[-1].role == "tool"


def _message(m: ChatMessage) -> Message:
    calls = tuple(
        ToolCall(
            c.id,
            c.function.name,
            _arguments_object(c.function.arguments),
            raw_arguments=c.function.arguments,
        )
        for c in m.tool_calls or ()
    )
    return Message(_ROLES[m.role], m.text(), tool_call_id=m.tool_call_id, tool_calls=calls)


def _arguments_object(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text or "{}")
    except (ValueError, RecursionError):  # not JSON, over 4,300 digits, nested too deeply
        return {}
    return parsed if isinstance(parsed, dict) else {}


def extension(result: QueryResult) -> dict[str, Any]:
    a = result.answer
    return {
        "id": result.id,
        "route": a.route.value,
        "route_reason": result.route_reason,
        "escalated": a.escalated,
        "extractive": a.extractive,
        "degraded": a.degraded,
        "citations": [asdict(c) for c in a.citations],
        "cache": result.cache,
        "cost_usd": round(usage_total(a).cost_usd, 8),
        "timings_ms": result.timings_ms,
        "config_version": result.config_version,
        **rewrite_fields(result),
        **partial_fields(result),
    }


def tool_calls_body(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """The model's calls of the client's tools, in OpenAI's shape."""
    return [
        {
            "id": call.id,
            "type": "function",
            # verbatim: a model's malformed arguments are the client's to see, not ours to fix
            "function": {"name": call.name, "arguments": _arguments(call)},
        }
        for call in calls
    ]


def _arguments(call: ToolCall) -> str:
    return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


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
    scope = request[SCOPE]
    body = await parse_body(request, ChatBody)
    if body.model not in (models := deployment_models(runtime)):
        raise model_not_found(body.model, models)
    refuse_unsupported(body)
    options = generation_options(body)
    query_text, history, trailing = split_messages(body.messages)
    check_limits(runtime, query_text, len(history) + len(trailing))
    lookup, store = cache_control(request)
    if options is not NO_OPTIONS or trailing:
        # an answer to the client's own parameters or tool results: not the cache's to give,
        # nor to keep
        lookup = store = False
        scope.record.client_shaped = True
    if body.user or body.safety_identifier:
        scope.record.fields["user"] = body.user or body.safety_identifier
    query = QueryRequest(
        id=request[REQUEST_ID],
        tenant=scope.tenant,
        query=query_text,
        history=history,
        route=body.model,
        cache_lookup=lookup,
        cache_store=store,
        options=options,
        trailing=trailing,
    )
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        fmt = ChatStreamFormat(query.id, body.model, include_usage)
        return await stream_answer(request, runtime, query, scope, fmt)
    result = await answer(runtime, query, scope)
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
        },
        headers=partial_headers(result.partial_index),
    )
