"""`POST /v1/chat/completions`: OpenAI's wire format in and out, querygate's routing inside.

`model` picks the route ("auto" classifies; "direct", "lookup" or "multihop" force one: the
names `GET /v1/models` lists; one this deployment cannot execute is answered by lookup, as on
`/v1/query`, and `route_reason` says so). The last user message is the query, earlier messages
the history. Route, citations and cost come back in an extra `querygate` field that OpenAI
clients ignore. Every OpenAI parameter is honoured or refused with 400 naming it
(gateway/http/chat_params.py); client tools' calls come back in OpenAI's shape. The flow is
the completion endpoint's too (`gateway.http.handlers.generation`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from aiohttp import web

from backends.llm.base import Message, ToolCall
from gateway.core.result import QueryResult
from gateway.errors import Unprocessable
from gateway.http.body import parse_body
from gateway.http.chat_params import CHAT_REFUSED
from gateway.http.handlers.generation import (
    OpenAIStreamFormat,
    answer_openai,
    checked,
    extension,
    usage_block,
)
from gateway.http.schemas import ChatBody, ChatMessage
from gateway.text import is_blank

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


class ChatStreamFormat(OpenAIStreamFormat):
    """OpenAI `chat.completion.chunk` events, closed by `data: [DONE]`."""

    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def opening(self) -> bytes:
        delta = {"role": "assistant", "content": ""}
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])

    def delta(self, text: str) -> bytes:
        return self._chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])

    def done(self, result: QueryResult) -> bytes:
        out = b""
        if calls := tool_calls_body(result.answer.tool_calls):
            # whole calls in one delta (OpenAI streams them in pieces; clients join either)
            pieces = [{"index": i, **call} for i, call in enumerate(calls)]
            out += self._chunk(
                [{"index": 0, "delta": {"tool_calls": pieces}, "finish_reason": None}]
            )
        finish = {"index": 0, "delta": {}, "finish_reason": result.answer.finish_reason}
        return out + self._close(finish, result)


def _completion(request_id: str, model: str, result: QueryResult) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
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


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, ChatBody)
    checked(body, CHAT_REFUSED)
    return await answer_openai(
        request,
        body,
        split_messages(body.messages),
        lambda request_id, result: _completion(request_id, body.model, result),
        lambda request_id, usage: ChatStreamFormat(request_id, body.model, usage),
    )
