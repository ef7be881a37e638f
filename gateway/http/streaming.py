"""Server-sent events: one writer, two dialects (querygate's own and OpenAI's chunks).

Everything that can fail with a status code (auth, validation, retrieval) runs before the
headers go out, so those failures stay ordinary JSON errors. Only the model's stream itself
can fail after that; it ends the stream with an error event instead of a silent cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, Protocol

from aiohttp import web

from gateway.core.guard import request_guard
from gateway.core.pipeline import Pipeline
from gateway.core.request import QueryRequest, RequestContext
from gateway.core.result import QueryResult
from gateway.core.runtime import Runtime
from gateway.core.scope import RequestScope
from gateway.http.appkeys import SERVICES
from gateway.http.failures import request_failure
from gateway.http.wire import partial_headers, query_body
from gateway.settings import ServerConfig
from routers.types import Generation


class StreamFormat(Protocol):
    def opening(self) -> bytes: ...

    def delta(self, text: str) -> bytes: ...

    def done(self, result: QueryResult) -> bytes: ...

    def error(self, kind: str, message: str) -> bytes: ...


def sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    prefix = f"event: {event}\n" if event else ""
    # A model can emit a lone surrogate; it must not break the stream (it becomes "?").
    return f"{prefix}data: {payload}\n\n".encode(errors="replace")


class QueryStreamFormat:
    """`delta` events with text, then one `done` event with the full /v1/query body."""

    def __init__(self, debug: bool = False) -> None:
        self._debug = debug

    def opening(self) -> bytes:
        return b""

    def delta(self, text: str) -> bytes:
        return sse({"text": text}, event="delta")

    def done(self, result: QueryResult) -> bytes:
        return sse(query_body(result, debug=self._debug), event="done")

    def error(self, kind: str, message: str) -> bytes:
        return sse({"error": {"type": kind, "message": message}}, event="error")


async def stream_answer(
    request: web.Request,
    runtime: Runtime,
    query: QueryRequest,
    scope: RequestScope,
    fmt: StreamFormat,
) -> web.StreamResponse:
    server = runtime.settings.server
    # The headers go out before the answer: they say how partial the index is now; the
    # closing event says it as of the answer.
    partial = request.app[SERVICES].ingests.partial_index(scope.tenant.id)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": query.id,
            **partial_headers(partial),
        }
    )
    preparing = asyncio.ensure_future(_prepare(runtime, query, scope))
    prepared: RequestContext | None = None
    try:
        prepared = await _await_keeping_alive(request, response, fmt, preparing, server)
    except Exception as exc:
        if not response.prepared:
            raise  # nothing sent yet: an ordinary JSON error with its status
        await _end_with_error(response, fmt, exc, scope)
        return response
    finally:
        preparing.cancel()  # a no-op when done; stops the work when the client went away
        if prepared is None:
            # The handler failed (a keep-alive write to a client gone, a cancellation) after
            # or while preparation finished: its single-flight lead is released all the same.
            release_abandoned(runtime.pipeline, preparing)
    try:
        if not response.prepared:
            # A budget spent since arrival (this request's rewrite, other requests) refuses
            # the model call to come now, as a plain 429, not as a stream's error event. It
            # stands for that call's own check: one read, not two.
            if isinstance(prepared.outcome, Generation):
                await prepared.llm.check_before_stream()
            await _open(request, response, fmt)
        try:
            async with (
                request_guard(scope.deadline),
                contextlib.aclosing(runtime.pipeline.stream(prepared)) as items,
            ):
                async for item in items:
                    chunk = fmt.delta(item) if isinstance(item, str) else fmt.done(item)
                    await response.write(chunk)
        except Exception as exc:
            await _end_with_error(response, fmt, exc, scope)
            return response
    finally:
        # The stream's end (or a client gone before it began) ends the request's single-
        # flight lead: its followers do not wait for an answer that will not be stored.
        await runtime.pipeline.release(prepared)
    await response.write_eof()
    return response


_RELEASING: set[asyncio.Task[None]] = set()  # strong references until each has run


def release_abandoned(pipeline: Pipeline, preparing: asyncio.Future[RequestContext]) -> None:
    """Release the context `preparing` produced (now or when it finishes) that no handler
    took. A preparation that failed or was cancelled released its own lead."""

    def release(done: asyncio.Future[RequestContext]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        task = asyncio.ensure_future(pipeline.release(done.result()))
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)

    preparing.add_done_callback(release)


async def _prepare(runtime: Runtime, query: QueryRequest, scope: RequestScope) -> RequestContext:
    async with request_guard(scope.deadline):
        return await runtime.pipeline.prepare(query, scope)


async def _await_keeping_alive(
    request: web.Request,
    response: web.StreamResponse,
    fmt: StreamFormat,
    preparing: asyncio.Future[RequestContext],
    server: ServerConfig,
) -> RequestContext:
    """The prepared request. Fast failures (auth, validation, retrieval down) come before any
    byte is sent, so they keep their status; a long silent stage (the agent loop) opens the
    stream and sends an SSE comment every `sse_keepalive_s` so proxies keep it open."""
    while True:
        done, _ = await asyncio.wait({preparing}, timeout=server.sse_keepalive_s)
        if done:
            return preparing.result()
        if not response.prepared:
            await _open(request, response, fmt)
        await response.write(b": keep-alive\n\n")


async def _open(request: web.Request, response: web.StreamResponse, fmt: StreamFormat) -> None:
    await response.prepare(request)
    await response.write(fmt.opening())


async def _end_with_error(
    response: web.StreamResponse, fmt: StreamFormat, exc: Exception, scope: RequestScope
) -> None:
    """Headers are out: the stream ends with an error event, never a silent cut.

    The event says what `gateway.errors`' table tells a stream; the detail goes to the
    request's one log line (with the id the client got in `X-Request-Id`), and the request is
    counted with its real outcome, not its 200."""
    if isinstance(exc, ConnectionError):
        raise exc  # the client went away: nobody to tell
    record = scope.record
    failure = request_failure(exc, client_gone=False, client_shaped=record.client_shaped)
    record.failure = failure
    await response.write(fmt.error(*failure.streamed))
    await response.write_eof()


async def stream_query(
    request: web.Request,
    runtime: Runtime,
    query: QueryRequest,
    scope: RequestScope,
    debug: bool = False,
) -> web.StreamResponse:
    return await stream_answer(request, runtime, query, scope, QueryStreamFormat(debug))
