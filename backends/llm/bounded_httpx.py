"""litellm's OpenAI-compatible calls over an httpx transport that bounds the reply it reads.

litellm reads a reply through the OpenAI SDK, whole, before the gateway sees any of it. Its calls
to `openai/` deployments therefore go through a client of ours (`BoundedClients`): an
`AsyncOpenAI` whose transport counts each reply's bytes against the call's `Reading`. The
transport is shared by concurrent calls, so `BoundedClients.bounded` names the call's `Reading`
in a request header (`READING_HEADER`; litellm passes `extra_headers` through), which the
transport takes off before the request leaves, binding that `Reading` to the reply. Past the
cap it stops reading: a streamed body ends after its last whole line and a chunk saying
finish_reason "length"; a JSON body is replaced by a valid one whose content is what the cut
body held, finish_reason "length". Either way the `Reading` says the reply was cut. Replies are
asked uncompressed, so the bytes counted are the bytes kept. Other providers stay on litellm's
own client: their replies are bounded by tokens once read.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, cast

import httpx
from openai import AsyncOpenAI

from backends.llm import openai_http
from backends.llm.bounds import Reading, salvaged_text
from backends.llm.deployments import Deployment

# The header naming a call's `Reading`; never sent upstream.
READING_HEADER = "x-querygate-reading"


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
    """An httpx transport whose replies are bounded by the `Reading` their request names."""

    def __init__(self, inner: httpx.AsyncBaseTransport, readings: dict[str, Reading]) -> None:
        self._inner = inner
        self._readings = readings

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.pop(READING_HEADER, None)
        bound = self._readings.get(key) if key is not None else None
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
        self._readings: dict[str, Reading] = {}  # of the calls being opened, by header value
        self._ids = itertools.count()

    @contextmanager
    def bounded(
        self, deployment: Deployment, args: dict[str, Any], bound: Reading
    ) -> Iterator[None]:
        """`args` (litellm's) made to read the reply against `bound` while the call opens: the
        bounded client, and the header naming `bound`. A provider litellm reaches another way
        keeps its own client (and gets no header)."""
        client = self.client(deployment)
        if client is None:
            yield
            return
        key = str(next(self._ids))
        args["client"] = client
        args["extra_headers"] = {**args.get("extra_headers", {}), READING_HEADER: key}
        self._readings[key] = bound
        try:
            yield
        finally:  # the reply's body holds its `Reading` from here
            del self._readings[key]

    def client(self, deployment: Deployment) -> AsyncOpenAI | None:
        """The client for `deployment`, None for a provider litellm reaches another way."""
        if not openai_http.serves(deployment.model):
            return None
        config = deployment.config
        base = config.api_base or openai_http.DEFAULT_API_BASE
        key = (base, deployment.api_key, config.timeout_s)
        if key not in self._clients:
            transport = BoundedTransport(httpx.AsyncHTTPTransport(), self._readings)
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
