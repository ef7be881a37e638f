"""litellm's OpenAI-compatible calls over an httpx transport that bounds the reply it reads.

litellm reads a reply through the OpenAI SDK, whole, before the gateway sees any of it. Its calls
to `openai/` deployments therefore go through a client of ours (`BoundedClients`): an
`AsyncOpenAI` whose transport counts each reply's bytes against the call's `Reading`, set around
the call with `reading` (a context variable: the transport is shared by concurrent calls, the
context is the calling task's own). Past the cap it stops reading: a streamed body ends after
its last whole line and a chunk saying finish_reason "length"; a JSON body is replaced by a valid
one whose content is what the cut body held, finish_reason "length". Either way the `Reading`
says the reply was cut. Replies are asked uncompressed, so the bytes counted are the bytes kept.
Other providers stay on litellm's own client: their replies are bounded by tokens once read.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import cast

import httpx
from openai import AsyncOpenAI

from backends.llm import openai_http
from backends.llm.bounds import Reading, salvaged_text
from backends.llm.deployments import Deployment

_READING: ContextVar[Reading | None] = ContextVar("querygate_reply_reading", default=None)


@contextmanager
def reading(bound: Reading) -> Iterator[Reading]:
    """Count the replies of the calls made inside against `bound`."""
    token = _READING.set(bound)
    try:
        yield bound
    finally:
        _READING.reset(token)


def cut_body(prefix: bytes) -> bytes:
    """A chat completion holding what the JSON body cut at `prefix` said (no usage: it is
    estimated)."""
    message = {"role": "assistant", "content": salvaged_text(prefix)}
    choice = {"index": 0, "message": message, "finish_reason": "length"}
    body = {"id": "chatcmpl-cut", "object": "chat.completion", "created": 0, "choices": [choice]}
    return json.dumps(body).encode()


# What ends a stream cut at the cap (litellm fails one that stops without a finish reason);
# the blank line first ends an event whose lines had come.
_CUT_CHUNK = {
    "id": "chatcmpl-cut",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "",
    "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
}
CUT_EVENTS = b"\ndata: " + json.dumps(_CUT_CHUNK).encode() + b"\n\ndata: [DONE]\n\n"


class BoundedBody(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, bound: Reading, sse: bool) -> None:
        self._inner = inner
        self._bound = bound
        self._sse = sse

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pieces = self._lines() if self._sse else self._body()
        async for piece in pieces:
            yield piece

    async def _lines(self) -> AsyncIterator[bytes]:
        """The body's whole lines, until its end or the cap (then a finish reason of "length")."""
        tail = b""
        async for data in self._inner:
            if not self._bound.take(len(data)):
                yield CUT_EVENTS
                return
            lines, newline, tail = (tail + data).rpartition(b"\n")
            if newline:
                yield lines + newline
        if tail:
            yield tail

    async def _body(self) -> AsyncIterator[bytes]:
        """The whole body, or the cut one's stand-in."""
        body = bytearray()
        async for data in self._inner:
            if not self._bound.take(len(data)):
                yield cut_body(bytes(body))
                return
            body += data
        yield bytes(body)

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose replies are bounded by the calling task's `Reading`."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        bound = _READING.get()
        if bound is None:
            return await self._inner.handle_async_request(request)
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        sse = response.headers.get("content-type", "").startswith("text/event-stream")
        # the length of a body replaced or cut is not the upstream's
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
        inner = cast(httpx.AsyncByteStream, response.stream)
        return httpx.Response(
            response.status_code,
            headers=headers,
            stream=BoundedBody(inner, bound, sse),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedClients:
    """One bounded `AsyncOpenAI` client per OpenAI-compatible upstream litellm calls, opened on
    first use and closed by `aclose`."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str, float], AsyncOpenAI] = {}

    def client(self, deployment: Deployment) -> AsyncOpenAI | None:
        """The client for `deployment`, None for a provider litellm reaches another way."""
        if not openai_http.serves(deployment.model):
            return None
        config = deployment.config
        base = config.api_base or openai_http.DEFAULT_API_BASE
        key = (base, deployment.api_key, config.timeout_s)
        if key not in self._clients:
            transport = BoundedTransport(httpx.AsyncHTTPTransport())
            self._clients[key] = AsyncOpenAI(
                api_key=deployment.api_key,
                base_url=base,
                timeout=config.timeout_s,
                max_retries=0,  # the tiers' own retries are the one retry layer
                http_client=httpx.AsyncClient(transport=transport, timeout=config.timeout_s),
            )
        return self._clients[key]

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
