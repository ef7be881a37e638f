"""What the OpenAI chat and completion endpoints share: the parameters checked, the question
asked through the pipeline (complete or streamed), and querygate's own fields in the answer.

`model` is a route name (`gateway.http.handlers.models`); the parameters are honoured or
refused by name (`gateway.http.chat_params`); route, citations and cost come back in an extra
`querygate` field that OpenAI clients ignore.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web

from backends.llm.base import NO_OPTIONS, Message
from gateway.core.request import QueryRequest
from gateway.core.result import QueryResult, partial_fields, rewrite_fields
from gateway.http.appkeys import REQUEST_ID, RUNTIME, SCOPE
from gateway.http.chat_params import Refused, generation_options, refuse_unsupported
from gateway.http.handlers.models import check_model
from gateway.http.handlers.query import answer, cache_control, check_limits
from gateway.http.schemas import GenerationBody
from gateway.http.streaming import StreamFormat, sse, stream_answer
from gateway.http.wire import partial_headers
from routers.generation import usage_total

# The completed answer's JSON body, from the request's id and the result.
Shape = Callable[[str, QueryResult], dict[str, Any]]
# The stream's events, from the request's id and whether usage closes it.
Streamed = Callable[[str, bool], StreamFormat]


def extension(result: QueryResult) -> dict[str, Any]:
    a = result.answer
    return {
        "id": result.id,
        "route": a.route.value,
        "route_reason": result.route_reason,
        "escalated": a.escalated,
        "extractive": a.extractive,
        "degraded": a.degraded,
        "reply_cut": a.reply_cut,
        "citations": [asdict(c) for c in a.citations],
        "cache": result.cache,
        "cost_usd": round(usage_total(a).cost_usd, 8),
        "timings_ms": result.timings_ms,
        "config_version": result.config_version,
        **rewrite_fields(result),
        **partial_fields(result),
    }


def usage_block(result: QueryResult) -> dict[str, int]:
    total = usage_total(result.answer)
    return {
        "prompt_tokens": total.prompt_tokens,
        "completion_tokens": total.completion_tokens,
        "total_tokens": total.prompt_tokens + total.completion_tokens,
    }


class OpenAIStreamFormat:
    """The chunk envelope both OpenAI streams share, and their close: the finishing choice with
    the `querygate` field, the usage chunk when asked for, `data: [DONE]`."""

    object_name = ""
    id_prefix = ""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self._id = f"{self.id_prefix}-{request_id}"
        self._model = model
        self._created = int(time.time())
        self._include_usage = include_usage

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": self._id,
                "object": self.object_name,
                "created": self._created,
                "model": self._model,
                "choices": choices,
                **extra,
            }
        )

    def _close(self, finish: dict[str, Any], result: QueryResult) -> bytes:
        out = self._chunk([finish], querygate=extension(result))
        if self._include_usage:
            out += self._chunk([], usage=usage_block(result))
        return out + sse("[DONE]")

    def error(self, kind: str, message: str) -> bytes:
        return sse({"error": {"type": kind, "message": message}}) + sse("[DONE]")


def checked(body: GenerationBody, refused: Refused) -> None:
    """404 for a model that is no route, 400 naming a parameter that cannot be honoured."""
    check_model(body.model)
    refuse_unsupported(body, refused)


async def answer_openai(
    request: web.Request,
    body: GenerationBody,
    asked: tuple[str, tuple[Message, ...], tuple[Message, ...]],
    shape: Shape,
    streamed: Streamed,
) -> web.StreamResponse:
    """`asked` (query, history, trailing tool turns) answered on the route `body.model` names,
    as `shape` makes the body or, with `stream`, as `streamed` makes the events."""
    runtime = request.app[RUNTIME].current
    scope = request[SCOPE]
    query_text, history, trailing = asked
    options = generation_options(body)
    check_limits(runtime, query_text, len(history) + len(trailing))
    lookup, store = cache_control(request)
    if options is not NO_OPTIONS or trailing:
        # an answer to the client's own parameters or tool results: not the cache's to give,
        # nor to keep
        lookup = store = False
        scope.record.client_shaped = True
    if user := body.end_user():
        scope.record.fields["user"] = user
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
        fmt = streamed(query.id, include_usage)
        return await stream_answer(request, runtime, query, scope, fmt)
    result = await answer(runtime, query, scope)
    return web.json_response(shape(query.id, result), headers=partial_headers(result.partial_index))
