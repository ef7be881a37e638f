"""Streamed answers on either wire: opening one, and the one relay that passes it on.

A stream is opened within the tiers' retried attempt up to its first chunk, so a stream that
dies before saying anything can still be retried or fall back; past that first chunk nothing is
retried (text has gone out). Each wire reads its own chunks (`LitellmStream`: litellm's objects
one at a time; `LeanStream`: the lean wire's batches of decoded OpenAI chunks, each batch one
delta, one event to the client) and `relay` does the rest for both: deltas as they come, then
one final delta with usage and cost, the finish reason and any tool calls the model made. On
streams a usage chunk is requested; when the upstream sends none, usage is estimated and the
final delta says so (`usage_estimated`). Both wires read a stream only as far as its bound
(`backends.llm.bounds`): the relay meters the deltas, each wire the bytes it reads.
"""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import litellm
from litellm import CustomStreamWrapper

from backends.errors import UpstreamError
from backends.llm import openai_http
from backends.llm.base import GenerationOptions, StreamDelta, ToolCall
from backends.llm.bounded_httpx import BoundedClients
from backends.llm.bounds import Reading, ReplyBound, ReplyMeter, reply_bound
from backends.llm.deployments import Deployment
from backends.llm.failures import CALL_ERRORS
from backends.llm.wire import (
    ODD_SHAPE,
    estimate_usage,
    lean_body,
    listed,
    litellm_args,
    odd_shape,
    parse_tool_call,
    reply_limit,
    text_counter,
    text_of,
    usage_tokens,
)


@dataclass(slots=True)
class Gathered:
    """What a stream's chunks said besides their text, as far as they have come."""

    finish_reason: str = ""
    reported: tuple[int, int] | None = None  # (prompt, completion) tokens, if a chunk said
    # streamed tool calls by index: id and name come first, the arguments in fragments
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    arguments_bytes: int = 0  # of the fragments the reply's meter has not counted yet

    def tool_call_piece(
        self, index: int, call_id: str | None, name: str | None, arguments: str | None
    ) -> None:
        call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        call["id"] = call_id or call["id"]
        call["name"] = name or call["name"]
        call["arguments"] += arguments or ""
        self.arguments_bytes += len(arguments or "")

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(_streamed_tool_call(self.calls[i]) for i in sorted(self.calls))


class OpenStream(ABC):
    """A stream whose first chunk has arrived: past this point nothing is retried. `bound` is
    the reply's (`backends.llm.bounds`), `read` its bytes read off the wire."""

    def __init__(
        self,
        deployment: Deployment,
        first: Any,
        rest: AsyncIterable[Any],
        bound: ReplyBound,
        read: Reading,
    ) -> None:
        self.deployment = deployment
        self._first = first
        self._rest = rest
        self.bound = bound
        self.read_bytes = read

    def batches(self) -> AsyncIterator[Any]:
        """The first batch of chunks, then the rest as they come."""
        return _prepend(self._first, self._rest)

    @abstractmethod
    def read(self, batch: Any, gathered: Gathered) -> str:
        """The text of one batch; the rest of what it says goes into `gathered`."""

    @abstractmethod
    def usage_is_upstreams(self) -> bool:
        """Whether the usage a chunk reported came from the upstream itself."""

    @abstractmethod
    def body_ended(self) -> bool:
        """Whether the body said it ended, finish reason aside."""

    @abstractmethod
    async def aclose(self) -> None:
        """Give the connection back (it is dropped when the body was not read to its end)."""


class LitellmStream(OpenStream):
    """A stream through `litellm.acompletion`: one chunk object at a time."""

    def __init__(
        self,
        deployment: Deployment,
        chunks: CustomStreamWrapper,
        first: Any,
        bound: ReplyBound,
        read: Reading,
    ) -> None:
        super().__init__(deployment, first, chunks, bound, read)
        self._wrapper = chunks

    @classmethod
    async def open(
        cls,
        deployment: Deployment,
        wire: list[dict[str, Any]],
        max_tokens: int | None,
        options: GenerationOptions,
        clients: BoundedClients,
    ) -> LitellmStream:
        """`clients`: litellm's bounded clients, for an OpenAI-compatible deployment."""
        bound = reply_bound(deployment.config, reply_limit(deployment, max_tokens, options))
        read = Reading(bound.max_bytes)
        args = litellm_args(deployment, wire, max_tokens, options)
        async with asyncio.timeout(deployment.config.timeout_s):
            # the transport binds `read` to the body as the call opens
            with clients.bounded(deployment, args, read):
                chunks = await litellm.acompletion(
                    **args, stream=True, stream_options={"include_usage": True}
                )
            if not isinstance(chunks, CustomStreamWrapper):
                raise UpstreamError("llm", f"{deployment.model}: unexpected {type(chunks)}")
            try:
                first = await anext(aiter(chunks), None)
            except BaseException:
                await chunks.aclose()  # don't leave the connection to the garbage collector
                raise
        if first is None:
            raise UpstreamError("llm", f"{deployment.model}: empty stream")
        return cls(deployment, chunks, first, bound, read)

    def read(self, batch: Any, gathered: Gathered) -> str:
        text = ""
        if batch.choices:
            choice = batch.choices[0]
            gathered.finish_reason = choice.finish_reason or gathered.finish_reason
            for piece in getattr(choice.delta, "tool_calls", None) or ():
                function = piece.function
                gathered.tool_call_piece(
                    int(piece.index or 0),
                    piece.id,
                    function.name if function is not None else None,
                    function.arguments if function is not None else None,
                )
            text = choice.delta.content or ""
        if (usage := getattr(batch, "usage", None)) is not None:
            gathered.reported = (usage.prompt_tokens, usage.completion_tokens)
        return text

    def usage_is_upstreams(self) -> bool:
        # litellm always appends a usage chunk of its own when one was requested, estimating
        # it when the upstream sent none, and strips the upstream's usage chunk from what it
        # yields; only its record of raw chunks tells the two apart.
        raw = getattr(self._wrapper, "chunks", ())
        return any(getattr(c, "usage", None) is not None for c in raw)

    def body_ended(self) -> bool:
        return False  # litellm tells a stream cut at a clean boundary by its finish reason only

    async def aclose(self) -> None:
        await self._wrapper.aclose()


class LeanStream(OpenStream):
    """A stream on the lean wire: batches of decoded OpenAI chunks."""

    def __init__(
        self, deployment: Deployment, chunks: openai_http.SseStream, first: Any, bound: ReplyBound
    ) -> None:
        super().__init__(deployment, first, chunks, bound, chunks.bound)
        self._sse = chunks

    @classmethod
    async def open(
        cls,
        http: openai_http.OpenAIHttp,
        deployment: Deployment,
        wire: list[dict[str, Any]],
        max_tokens: int | None,
        options: GenerationOptions,
    ) -> LeanStream:
        body = lean_body(deployment, wire, max_tokens, options)
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        config = deployment.config
        bound = reply_bound(config, body["max_tokens"])
        read = Reading(bound.max_bytes)
        async with asyncio.timeout(config.timeout_s):
            chunks = await http.stream(
                config.api_base, deployment.api_key, body, config.timeout_s, read
            )
            try:
                first = await anext(aiter(chunks), None)
            except BaseException:
                await chunks.aclose()
                raise
        if first is None:
            await chunks.aclose()
            raise UpstreamError("llm", f"{deployment.model}: empty stream")
        return cls(deployment, chunks, first, bound)

    def read(self, batch: Any, gathered: Gathered) -> str:
        texts: list[str] = []
        try:  # one try a batch: free on the hot path, unlike a context manager a chunk
            for chunk in batch:
                if choices := listed(chunk, "choices"):
                    choice = choices[0]
                    gathered.finish_reason = choice.get("finish_reason") or gathered.finish_reason
                    delta = choice.get("delta") or {}
                    for piece in listed(delta, "tool_calls"):
                        function = piece.get("function")
                        gathered.tool_call_piece(
                            int(piece.get("index") or 0),
                            piece.get("id"),
                            function.get("name") if function is not None else None,
                            function.get("arguments") if function is not None else None,
                        )
                    if text := text_of(delta):
                        texts.append(text)
                if (usage := chunk.get("usage")) is not None:
                    gathered.reported = usage_tokens(usage)
        except ODD_SHAPE as exc:
            raise odd_shape(self.deployment, "stream chunk", exc) from exc
        return "".join(texts)

    def usage_is_upstreams(self) -> bool:
        return True  # the lean wire adds no usage of its own

    def body_ended(self) -> bool:
        return self._sse.ended  # `data: [DONE]` came

    async def aclose(self) -> None:
        await self._sse.aclose()


async def relay(opened: OpenStream, wire: list[dict[str, Any]]) -> AsyncIterator[StreamDelta]:
    """Deltas as they come, then one final delta with usage and cost. A reply past its bound
    is not read on: its final delta comes at once, finish_reason "length", `cut` saying which
    bound (its usage estimated, a tool call it had begun dropped)."""
    deployment = opened.deployment
    parts: list[str] = []
    gathered = Gathered()
    model = deployment.model
    meter = ReplyMeter(text_counter(model), opened.bound)
    try:
        async for batch in opened.batches():
            text = opened.read(batch, gathered)
            if text or gathered.arguments_bytes:
                text = meter.take(text, gathered.arguments_bytes)
                gathered.arguments_bytes = 0
            if text:
                parts.append(text)
                yield StreamDelta(text=text, model=model)
            if meter.cut is not None:
                break
    except CALL_ERRORS as exc:
        # text has already gone out: no retry or fallback can make this answer whole
        raise UpstreamError("llm", f"{model}: stream interrupted: {exc}") from exc
    cut = meter.cut or opened.read_bytes.cut
    reported = gathered.reported
    estimated = cut is not None or reported is None or not opened.usage_is_upstreams()
    if reported is None or estimated:
        reported = estimate_usage(model, wire, "".join(parts))
    yield StreamDelta(
        done=True,
        usage=deployment.cost(*reported),
        model=model,
        finish_reason="length" if cut else gathered.finish_reason,
        ended=cut is not None or bool(gathered.finish_reason) or opened.body_ended(),
        usage_estimated=estimated,
        tool_calls=() if cut else gathered.tool_calls(),
        cut=cut,
    )


def _streamed_tool_call(call: dict[str, str]) -> ToolCall:
    function = SimpleNamespace(name=call["name"], arguments=call["arguments"])
    return parse_tool_call(SimpleNamespace(id=call["id"], function=function))


async def _prepend(first: Any, rest: AsyncIterable[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item
