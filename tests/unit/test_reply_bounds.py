"""The bound on what is read of a model's reply: the text a cut body held, the stream meter."""

from __future__ import annotations

import json

from backends.llm.base import TierConfig
from backends.llm.bounds import (
    BYTES_PER_TOKEN,
    OVERHEAD_BYTES,
    ReplyBound,
    ReplyMeter,
    reply_bound,
    salvaged_text,
)


def words(text: str) -> int:
    return len(text.split())


def test_a_body_cut_anywhere_holds_a_prefix_of_its_content() -> None:
    content = 'a "quoted" back\\slash\nnew line \u00e9 \U0001f600 and the end'
    answer = {"choices": [{"message": {"role": "assistant", "content": content}}], "usage": {}}
    body = json.dumps(answer).encode()
    for cut in range(len(body) + 1):
        assert content.startswith(salvaged_text(body[:cut])), cut
    assert salvaged_text(body) == content
    assert salvaged_text(body[: body.index(b'"content"')]) == ""


def test_a_body_whose_content_is_not_a_string_holds_no_text() -> None:
    assert salvaged_text(b'{"choices": [{"message": {"content": null, "tool_calls": [') == ""


def test_the_byte_cap_is_in_proportion_to_the_tokens_and_never_over_the_tiers() -> None:
    tier = TierConfig(model="openai/m", reply_token_margin=0.5, max_reply_bytes=1 << 20)
    small = reply_bound(tier, 100)
    assert small.max_tokens == 166
    assert small.max_bytes == OVERHEAD_BYTES + 166 * BYTES_PER_TOKEN
    assert reply_bound(tier, 100_000).max_bytes == 1 << 20


def test_the_meter_cuts_a_stream_at_its_token_bound() -> None:
    meter = ReplyMeter(words, ReplyBound(max_bytes=1 << 20, max_tokens=10))
    kept = [meter.take("one two three ") for _ in range(3)]
    assert meter.cut is None and "".join(kept).split() == ["one", "two", "three"] * 3
    last = meter.take("four five six ")
    assert meter.cut == "tokens"
    assert words("".join(kept) + last) <= 10 and last.startswith("four")


def test_the_meter_cuts_a_stream_at_its_byte_cap_counting_tool_arguments() -> None:
    meter = ReplyMeter(words, ReplyBound(max_bytes=100, max_tokens=1000))
    assert meter.take("", other_bytes=90) == ""
    assert meter.cut is None
    assert meter.take("x" * 20) == "x" * 10
    assert meter.cut == "bytes"


def test_the_meter_counts_no_tokens_while_the_text_is_shorter_than_the_bound() -> None:
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return words(text)

    meter = ReplyMeter(count, ReplyBound(max_bytes=1 << 20, max_tokens=50))
    for _ in range(10):
        meter.take("abcd ")
    assert counted == [] and meter.cut is None
