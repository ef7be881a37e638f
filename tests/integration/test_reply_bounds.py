"""An upstream that ignores `max_tokens` is read only as far as the call's bound, on both wires.

Through litellm's real client path and the lean wire against the fake upstream process, which
floods a reply of many megabytes (`flood_bytes`) streamed or not. The reply is cut at its bound
and marked (`cut`, finish_reason "length"); what the gateway allocated while reading stays far
under the reply's size (tracemalloc in this process: the fake is another one), and the fake saw
its reader stop before the end.
"""

from __future__ import annotations

import json
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from backends.llm.base import Completion, LLMCall, Message, StreamDelta, TierConfig
from backends.llm.bounded_httpx import READING_HEADER
from backends.llm.bounds import reply_bound
from backends.llm.tiers import LiteLLMTiers
from backends.llm.wire import count_tokens
from tests.fixtures.upstream import upstream_stats

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
]

FLOOD = 40 * 1024 * 1024
# what reading may allocate at most: a few times the largest bound below, far under FLOOD
HEAP_CEILING = 12 * 1024 * 1024


def _tier(base_url: str, **overrides: Any) -> TierConfig:
    settings: dict[str, Any] = {"model": "openai/fake-small", "api_base": base_url, "retries": 0}
    return TierConfig(**(settings | overrides))


@pytest.fixture(params=["lean", "litellm"])
def lean(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "lean")


def _flooding(flood: int) -> tuple[str, tuple[Message, ...]]:
    key = uuid.uuid4().hex
    directive = json.dumps({"flood_bytes": flood, "key": key})
    return key, (Message("user", f"say a little [[fake:{directive}]]"),)


async def _answer(llm: LiteLLMTiers, call: LLMCall, stream: bool) -> Completion:
    """The call's answer, streamed or not, as one completion (a stream's text joined)."""
    if not stream:
        return await llm.complete(call)
    deltas: list[StreamDelta] = [d async for d in llm.stream(call)]
    final = deltas[-1]
    assert final.done and all(not d.done for d in deltas[:-1])
    text = "".join(d.text for d in deltas)
    usage = final.usage
    assert usage is not None
    return Completion(
        text, "small", final.model, usage, (), final.finish_reason, final.usage_estimated, final.cut
    )


async def _peak(work: Callable[[], Awaitable[Completion]]) -> tuple[Completion, int]:
    """`work`'s answer and the most this process held allocated while it ran (bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        done = await work()
        return done, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def _flood_sent(base_url: str, key: str) -> int:
    stats = await upstream_stats(base_url)
    return int(stats["flood_sent_by_key"].get(key, 0))


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_reply_past_the_byte_cap_is_cut_there_and_marked(
    fake_upstream: str, lean: bool, stream: bool
) -> None:
    # a token limit that allows megabytes: the byte cap is what binds
    tier = _tier(fake_upstream, max_reply_bytes=256 * 1024, max_tokens=1_000_000)
    llm = LiteLLMTiers(tier, None, lean_http=lean)
    try:
        await llm.warm_up()  # the tokenizer loads once a process, not while this is traced
        key, messages = _flooding(FLOOD)
        done, peak = await _peak(lambda: _answer(llm, LLMCall("small", messages), stream))
    finally:
        await llm.aclose()
    assert (done.cut, done.finish_reason, done.usage_estimated) == ("bytes", "length", True)
    assert 0 < len(done.text.encode()) <= 256 * 1024
    assert done.text.count("flood flood") > 1000  # the text that came, up to the cap
    assert peak < HEAP_CEILING
    # the reader stopped: the fake never got to write the whole reply
    assert await _flood_sent(fake_upstream, key) < FLOOD
    # the header naming the call's bound is the transport's: it never leaves the gateway
    (names,) = (await upstream_stats(fake_upstream))["header_names_by_key"][key]
    assert "content-type" in names and READING_HEADER not in names


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_reply_past_the_token_bound_is_cut_to_it(
    fake_upstream: str, lean: bool, stream: bool
) -> None:
    tier = _tier(fake_upstream, max_tokens=40, reply_token_margin=0.25)
    bound = reply_bound(tier, 40)
    llm = LiteLLMTiers(tier, None, lean_http=lean)
    try:
        await llm.warm_up()
        key, messages = _flooding(FLOOD)
        done, peak = await _peak(lambda: _answer(llm, LLMCall("small", messages), stream))
    finally:
        await llm.aclose()
    assert (done.cut, done.finish_reason) == ("tokens" if stream else "bytes", "length")
    tokens = count_tokens("openai/fake-small", text=done.text)
    assert 0 < tokens <= bound.max_tokens
    assert peak < HEAP_CEILING
    assert await _flood_sent(fake_upstream, key) < FLOOD


async def test_a_body_inside_the_byte_cap_but_past_the_token_bound_is_cut_to_it(
    fake_upstream: str, lean: bool
) -> None:
    tier = _tier(fake_upstream, max_tokens=40)
    bound = reply_bound(tier, 40)
    llm = LiteLLMTiers(tier, None, lean_http=lean)
    try:
        _, messages = _flooding(bound.max_bytes // 2)  # inside the bytes, far past the tokens
        done = await llm.complete(LLMCall("small", messages))
    finally:
        await llm.aclose()
    assert (done.cut, done.finish_reason) == ("tokens", "length")
    assert 0 < count_tokens("openai/fake-small", text=done.text) <= bound.max_tokens


async def test_a_reply_inside_its_bound_is_not_marked(fake_upstream: str, lean: bool) -> None:
    llm = LiteLLMTiers(_tier(fake_upstream), None, lean_http=lean)
    try:
        done = await llm.complete(LLMCall("small", (Message("user", "hello there"),)))
        streamed = await _answer(llm, LLMCall("small", (Message("user", "hello there"),)), True)
    finally:
        await llm.aclose()
    assert (done.cut, done.finish_reason) == (None, "stop")
    assert (streamed.cut, streamed.finish_reason, streamed.text) == (None, "stop", done.text)
