"""`POST /v1/completions`: OpenAI's (legacy) text completion, as clients that default to it
send it (llama-index's OpenAILike, for one).

The prompt is asked as one user message, on the route `model` names, exactly as the chat
endpoint asks its last user message (the same parameters, honoured or refused by name; the same
`querygate` field), and answered in OpenAI's `text_completion` shape, streamed too.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from gateway.core.result import QueryResult
from gateway.http.body import parse_body
from gateway.http.chat_params import COMPLETION_REFUSED
from gateway.http.handlers.generation import answer_openai, checked, extension, usage_block
from gateway.http.schemas import CompletionBody
from gateway.http.streaming import sse


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


class CompletionStreamFormat:
    """`text_completion` chunks, closed by `data: [DONE]`."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self._id = f"cmpl-{request_id}"
        self._model = model
        self._created = int(time.time())
        self._include_usage = include_usage

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": self._id,
                "object": "text_completion",
                "created": self._created,
                "model": self._model,
                "choices": choices,
                **extra,
            }
        )

    def opening(self) -> bytes:
        return b""

    def delta(self, text: str) -> bytes:
        return self._chunk([_choice(text, None)])

    def done(self, result: QueryResult) -> bytes:
        finish = _choice("", result.answer.finish_reason)
        out = self._chunk([finish], querygate=extension(result))
        if self._include_usage:
            out += self._chunk([], usage=usage_block(result))
        return out + sse("[DONE]")

    def error(self, kind: str, message: str) -> bytes:
        return sse({"error": {"type": kind, "message": message}}) + sse("[DONE]")


def _completion(request_id: str, model: str, result: QueryResult) -> dict[str, Any]:
    return {
        "id": f"cmpl-{request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(result.answer.text, result.answer.finish_reason)],
        "usage": usage_block(result),
        "querygate": extension(result),
    }


async def handle_completions(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, CompletionBody)
    checked(body, COMPLETION_REFUSED)
    return await answer_openai(
        request,
        body,
        (body.text(), (), ()),
        lambda request_id, result: _completion(request_id, body.model, result),
        lambda request_id, usage: CompletionStreamFormat(request_id, body.model, usage),
    )
