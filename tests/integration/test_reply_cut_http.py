"""A model reply past its bound reaches the client cut and marked, and is never cached.

In process (`app_client`) over litellm's real client to the fake upstream, which floods a reply
of many megabytes whatever `max_tokens` says (`flood_bytes`).
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

import pytest

from tests.fixtures.app import Client, OpenClient, auth, scrape

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLOOD = 40 * 1024 * 1024
CUT = "querygate_llm_replies_cut_total"


@pytest.fixture(scope="module")
async def gateway(app_client: OpenClient, fake_upstream: str) -> Client:
    return await app_client(upstream=fake_upstream)


def _flooding() -> list[dict[str, str]]:
    # letters only: a key that looks like an identifier would send the question to lookup
    key = "flood" + "".join(random.choice(string.ascii_lowercase) for _ in range(12))
    directive = json.dumps({"flood_bytes": FLOOD, "key": key})
    return [{"role": "user", "content": f"Say hello [[fake:{directive}]]"}]


async def _chat(gw: Client, **body: Any) -> tuple[int, str]:
    async with gw.post("/v1/chat/completions", headers=auth(), json=body) as resp:
        return resp.status, await resp.text()


async def test_a_flooded_reply_is_cut_marked_counted_and_not_cached(gateway: Client) -> None:
    before = (await scrape(gateway)).value(CUT, tier="small", reason="bytes")
    messages = _flooding()
    answers = []
    for _ in range(2):
        status, text = await _chat(gateway, model="direct", messages=messages, max_tokens=30)
        assert status == 200, text[:300]
        answers.append(json.loads(text))
    first, again = answers
    choice = first["choices"][0]
    assert choice["finish_reason"] == "length"
    assert first["querygate"]["reply_cut"] == "bytes"
    assert 0 < len(choice["message"]["content"]) < 100_000
    # a cut answer is never stored: the same question is asked of the model again
    assert again["querygate"]["cache"] == "miss" and again["querygate"]["reply_cut"] == "bytes"
    after = (await scrape(gateway)).value(CUT, tier="small", reason="bytes")
    assert after == before + 2


async def test_a_flooded_stream_ends_cut_and_marked(gateway: Client) -> None:
    before = (await scrape(gateway)).value(CUT, tier="small", reason="tokens")
    status, text = await _chat(
        gateway, model="direct", messages=_flooding(), max_tokens=30, stream=True
    )
    assert status == 200, text[:300]
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    last = events[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["querygate"]["reply_cut"] == "tokens"
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert 0 < len(streamed) < 10_000
    after = (await scrape(gateway)).value(CUT, tier="small", reason="tokens")
    assert after == before + 1


async def test_a_reply_inside_its_bound_is_not_marked(gateway: Client) -> None:
    status, text = await _chat(
        gateway, model="direct", messages=[{"role": "user", "content": "Hello there"}]
    )
    assert status == 200, text[:300]
    body = json.loads(text)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["querygate"]["reply_cut"] is None
