"""The lean wire's SSE reading: lines split across reads, and the batches one read makes.

`SseStream` reads a real aiohttp `StreamReader`, fed here by hand so each test decides exactly
which bytes one read finds buffered.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from backends.llm.bounds import Reading
from backends.llm.openai_http import (
    MAX_LINE,
    MalformedBody,
    SseLines,
    SseStream,
    WireConnectionError,
    WireStatusError,
)


def event(content: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def test_a_line_split_across_reads_comes_out_once_complete() -> None:
    lines = SseLines()
    whole = event("hello")
    assert lines.feed(whole[:10]) == []
    assert lines.feed(whole[10:-2]) == []
    assert lines.feed(whole[-2:]) == [whole[6:-2]]


def test_the_lines_one_read_completes_come_out_together_and_the_rest_waits() -> None:
    lines = SseLines()
    second = event("b")
    payloads = lines.feed(event("a") + b": comment\nevent: x\n\r\n" + second[:-5])
    assert payloads == [event("a")[6:-2]]
    assert lines.feed(second[-5:] + b"data: [DONE]\r\n") == [second[6:-2], b"[DONE]"]


def test_the_body_end_completes_a_last_line_without_its_newline() -> None:
    lines = SseLines()
    assert lines.feed(b"data: [DONE]") == []
    assert lines.feed(b"") == [b"[DONE]"]
    assert lines.feed(b"") == []


def test_a_line_without_end_is_refused_past_the_limit() -> None:
    lines = SseLines()
    with pytest.raises(MalformedBody):
        lines.feed(b"data: " + b"x" * MAX_LINE)


class _Response:
    """What `SseStream` uses of an `aiohttp.ClientResponse`: its body and `release`."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        protocol = BaseProtocol(loop)
        protocol.connection_made(asyncio.Transport())  # a reader waits only while connected
        self.content = aiohttp.StreamReader(protocol, 1 << 16, loop=loop)
        self.released = False

    def release(self) -> None:
        self.released = True


def _stream(max_bytes: int = 1 << 20) -> tuple[SseStream, aiohttp.StreamReader]:
    response = _Response()
    bound = Reading(max_bytes)
    return SseStream(cast(aiohttp.ClientResponse, response), bound), response.content


def texts(batch: list[dict[str, Any]]) -> list[str]:
    return [chunk["choices"][0]["delta"]["content"] for chunk in batch]


async def test_one_batch_holds_every_chunk_one_read_found() -> None:
    stream, body = _stream()
    body.feed_data(event("a") + event("b") + event("c"))
    batches = aiter(stream)
    assert texts(await anext(batches)) == ["a", "b", "c"]
    body.feed_data(event("d"))
    assert texts(await anext(batches)) == ["d"]  # one ready chunk goes on alone, at once


async def test_a_chunk_split_across_reads_waits_for_its_end() -> None:
    stream, body = _stream()
    whole = event("a")
    body.feed_data(whole[:15])
    waiting = asyncio.ensure_future(anext(aiter(stream)))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    body.feed_data(whole[15:])
    assert texts(await asyncio.wait_for(waiting, 1)) == ["a"]
    await stream.aclose()


async def test_done_mid_read_ends_the_stream_after_the_chunks_before_it() -> None:
    stream, body = _stream()
    body.feed_data(event("a") + b"data: [DONE]\n\n" + event("after"))
    assert [texts(b) async for b in stream] == [["a"]]
    assert stream.ended


async def test_a_body_that_just_stops_is_not_ended() -> None:
    stream, body = _stream()
    body.feed_data(event("a"))
    body.feed_eof()
    assert [texts(b) async for b in stream] == [["a"]]
    assert not stream.ended


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (b'data: {"error": {"message": "overloaded", "code": "529"}}\n\n', WireStatusError),
        (b"data: {not json\n\n", MalformedBody),
    ],
)
async def test_a_failure_mid_read_raises_after_the_chunks_before_it(
    failure: bytes, raised: type[Exception]
) -> None:
    stream, body = _stream()
    body.feed_data(event("a") + event("b") + failure + event("after"))
    batches = aiter(stream)
    assert texts(await anext(batches)) == ["a", "b"]
    with pytest.raises(raised) as caught:
        await anext(batches)
    if isinstance(caught.value, WireStatusError):
        assert caught.value.status_code == 529


async def test_a_cut_body_is_a_connection_error() -> None:
    stream, body = _stream()
    body.feed_data(event("a"))
    batches = aiter(stream)
    assert texts(await anext(batches)) == ["a"]
    body.set_exception(aiohttp.ClientPayloadError("cut"))
    with pytest.raises(WireConnectionError):
        await anext(batches)


async def test_aclose_releases_the_connection() -> None:
    response = _Response()
    stream = SseStream(cast(aiohttp.ClientResponse, response), Reading(1 << 20))
    await stream.aclose()
    assert response.released


async def test_a_body_past_the_byte_cap_is_not_read_on() -> None:
    one = event("a")
    stream, body = _stream(max_bytes=len(one) * 2)
    body.feed_data(one)
    batches = aiter(stream)
    assert texts(await anext(batches)) == ["a"]
    body.feed_data(event("b") * 4)  # past the cap: this read is counted, not decoded
    assert await anext(batches, None) is None
    assert stream.bound.cut == "bytes" and stream.bound.read == len(one) * 5
