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
from gateway.http.handlers.generation import (
    OpenAIStreamFormat,
    answer_openai,
    checked,
    extension,
    usage_block,
)
from gateway.http.schemas import CompletionBody


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


class CompletionStreamFormat(OpenAIStreamFormat):
    """`text_completion` chunks, closed by `data: [DONE]`."""

    object_name = "text_completion"
    id_prefix = "cmpl"

    def opening(self) -> bytes:
        return b""

    def delta(self, text: str) -> bytes:
        return self._chunk([_choice(text, None)])

    def done(self, result: QueryResult) -> bytes:
        return self._close(_choice("", result.answer.finish_reason), result)


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
