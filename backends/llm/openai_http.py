"""The lean wire to OpenAI-compatible upstreams: one pooled aiohttp session, JSON in and out.

`LiteLLMTiers` sends a tier's `openai/<model>` deployments through this instead of
`litellm.acompletion`: the retries, fallbacks, cooldowns and cost stay in `LiteLLMTiers`, only
the HTTP call changes. litellm's call builds logging objects, computes its own cost, maps
parameters and goes through the OpenAI SDK over httpx; this one only sends JSON, at a fraction of
the CPU (docs/benchmarks.md). Every other provider, and the token counting used when an
upstream reports no usage, stay on litellm.

Errors keep the meaning `backends.llm.failures.classify` gives litellm's: a connection that fails,
resets or is cut is a `WireConnectionError` (a `ConnectionError`: transient), an HTTP status is a
`WireStatusError` carrying `status_code` (429 and 5xx transient, other 4xx a refused request), a
body that is not JSON a `MalformedBody` raised from the `JSONDecodeError` (tried once, then the
next model).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from backends.llm.bounds import Reading, salvaged_text
from backends.llm.propagation import trace_headers

# litellm's prefix for "an OpenAI-compatible server at api_base": the deployments this serves.
PREFIX = "openai/"
DEFAULT_API_BASE = "https://api.openai.com/v1"


def serves(model: str) -> bool:
    """Whether `model` (a litellm model string) names an OpenAI-compatible upstream."""
    return model.startswith(PREFIX) and len(model) > len(PREFIX)


class WireError(Exception):
    """A failed call on the lean wire."""


class WireStatusError(WireError):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code


class WireConnectionError(WireError, ConnectionError):
    """The connection failed, was reset or cut mid-body."""


class MalformedBody(WireError):
    """The upstream answered 200 with something that is not the expected JSON."""


def _loads(text: str | bytes) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedBody(f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise MalformedBody(f"a JSON {type(body).__name__}, not an object")
    return body


class OpenAIHttp:
    """One aiohttp session per process for every OpenAI-compatible deployment (keep-alive
    connections pooled per host). Opened by `start` in the app's start-up (or on first use),
    closed by `aclose`; no client retries: `LiteLLMTiers` is the one retry layer."""

    def __init__(self, pool_size: int = 256) -> None:
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def start(self) -> None:
        """Open the session now, in the running loop (the app's start-up), not on the first
        request."""
        self._open()

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("OpenAIHttp is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_size, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # the body is ours and small; skip aiohttp's per-request header defaults
                skip_auto_headers=("User-Agent",),
                json_serialize=json.dumps,
            )
        return self._session

    async def complete(
        self,
        api_base: str | None,
        api_key: str,
        body: dict[str, Any],
        timeout_s: float,
        bound: Reading,
    ) -> dict[str, Any]:
        """The decoded answer of a non-streamed chat completion, read as far as `bound`'s cap:
        a body past it is not read on, and the answer is the content it held (`bound.cut`)."""
        session = self._open()
        try:
            async with session.post(
                _url(api_base),
                data=json.dumps(body).encode(),
                headers=_headers(api_key),
                timeout=_timeout(timeout_s),
            ) as response:
                payload = await _bounded_read(response, bound)
                if response.status != 200:
                    raise WireStatusError(response.status, _error_text(payload))
        except aiohttp.ClientError as exc:
            raise WireConnectionError(f"{type(exc).__name__}: {exc}") from exc
        if bound.cut is not None:
            message = {"role": "assistant", "content": salvaged_text(payload)}
            return {"choices": [{"index": 0, "message": message, "finish_reason": "length"}]}
        return _loads(payload)

    async def stream(
        self,
        api_base: str | None,
        api_key: str,
        body: dict[str, Any],
        timeout_s: float,
        bound: Reading,
    ) -> SseStream:
        """An open streamed chat completion (status checked, no chunk read yet)."""
        session = self._open()
        try:
            response = await session.post(
                _url(api_base),
                data=json.dumps(body).encode(),
                headers=_headers(api_key),
                timeout=_timeout(timeout_s),
            )
        except aiohttp.ClientError as exc:
            raise WireConnectionError(f"{type(exc).__name__}: {exc}") from exc
        if response.status != 200:
            try:
                payload = await _bounded_read(response, bound)
            except aiohttp.ClientError:
                payload = b""
            finally:
                response.release()
            raise WireStatusError(response.status, _error_text(payload))
        return SseStream(response, bound)

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


async def _bounded_read(response: aiohttp.ClientResponse, bound: Reading) -> bytes:
    """The body, or as much of it as `bound` allows (the connection is then dropped)."""
    body = bytearray()
    async for data in response.content.iter_any():
        if not bound.take(len(data)):
            response.close()
            break
        body += data
    return bytes(body)


# No chunk comes near this; a body without newlines must not grow a buffer without bound.
MAX_LINE = 1 << 20


class SseLines:
    """The payloads of an SSE body's `data:` lines, from the body read in arbitrary pieces: a
    line split across reads waits for its end, the lines one read completes come out together.
    Blank separators, comments and `event:` lines are skipped."""

    def __init__(self) -> None:
        self._tail = b""  # the start of a line whose end has not come yet

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the lines `data` completes; `b""` is the body's end, which completes
        a last line sent without its newline."""
        if data:
            *lines, self._tail = (self._tail + data).split(b"\n")
            if len(self._tail) > MAX_LINE:
                raise MalformedBody(f"an SSE line longer than {MAX_LINE} bytes")
        else:
            lines, self._tail = [self._tail], b""
        return [line[5:].strip() for raw in lines if (line := raw.strip()).startswith(b"data:")]


class SseStream:
    """A chat completion's server-sent events as batches of decoded chunks, until `data: [DONE]`
    or the end of the body. A batch is every chunk one read found buffered: what arrived
    together is handled together downstream (one delta, one write to the client), and no read
    waits for more once one chunk is complete; the body ends early once the bytes read pass
    `bound`'s cap (`bound.cut` says so). `aclose` gives the connection back (or drops it when
    unread)."""

    def __init__(self, response: aiohttp.ClientResponse, bound: Reading) -> None:
        self._response = response
        self.bound = bound
        self._batches = self._read()
        self.ended = False  # `data: [DONE]` was read: the body did not just stop

    def __aiter__(self) -> AsyncIterator[list[dict[str, Any]]]:
        return self._batches

    async def _read(self) -> AsyncIterator[list[dict[str, Any]]]:
        lines = SseLines()
        try:
            while True:
                data = await self._response.content.readany()  # all it holds, b"" at the end
                if not self.bound.take(len(data)):
                    return
                batch, failure = self._decode(lines.feed(data))
                if batch:
                    yield batch
                if failure is not None:
                    raise failure
                if self.ended or not data:
                    return
        except aiohttp.ClientError as exc:
            raise WireConnectionError(f"stream cut: {type(exc).__name__}: {exc}") from exc

    def _decode(self, payloads: list[bytes]) -> tuple[list[dict[str, Any]], WireError | None]:
        """The chunks up to `[DONE]` or a failure, and that failure: it is raised once the
        chunks before it have gone on, as they would have one by one."""
        chunks: list[dict[str, Any]] = []
        for data in payloads:
            if data == b"[DONE]":
                self.ended = True
                break
            try:
                chunks.append(_chunk(data))
            except WireError as exc:
                return chunks, exc
        return chunks, None

    async def aclose(self) -> None:
        await self._batches.aclose()  # type: ignore[attr-defined]  # an async generator
        self._response.release()


def _chunk(data: bytes) -> dict[str, Any]:
    """One decoded event; an error event (OpenAI's shape, sent mid-stream) raises."""
    chunk = _loads(data)
    if "error" in chunk and not chunk.get("choices"):
        error = chunk["error"]
        code = error.get("code") if isinstance(error, dict) else None
        status = int(str(code)) if str(code).isdigit() else 500
        raise WireStatusError(status, _error_text(json.dumps(chunk).encode()))
    return chunk


def _url(api_base: str | None) -> str:
    return (api_base or DEFAULT_API_BASE).rstrip("/") + "/chat/completions"


def _headers(api_key: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    return headers | trace_headers()


def _timeout(timeout_s: float) -> aiohttp.ClientTimeout:
    # Per socket operation, as the OpenAI SDK bounds it; the caller bounds the whole call.
    return aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)


def _error_text(payload: bytes) -> str:
    """The upstream's error message when it sent OpenAI's error shape, else the body's start."""
    try:
        body = json.loads(payload)
        message = body["error"]["message"]
        if isinstance(message, str):
            return message[:300]
    except (ValueError, KeyError, TypeError):
        pass
    return payload[:300].decode(errors="replace")
