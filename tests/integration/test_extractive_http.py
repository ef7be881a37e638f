"""A gateway with no model, as a new user first runs it (escalation off, the default), in
process over HTTP: questions get cited extractive answers, whether the router sends them to
lookup or they are forced direct; small talk a short honest reply; `max_tokens` cuts the
answer; streams carry the same answer; a follow-up says it was not rewritten.

The documents are Wikipedia lead sections of the offline sample (tests/data/wiki, CC BY-SA).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from backends.embeddings.base import Embedder, token_window
from gateway.core.stages import NOT_REWRITTEN
from routers.direct import LOOKED_UP, NO_MODEL_TEXT
from routers.extractive import NO_ANSWER_TEXT
from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")

FRESH = {"Cache-Control": "no-cache, no-store"}


@pytest.fixture(scope="module")
async def client(app_client: OpenClient) -> Client:
    return await app_client(
        corpora={"acme": "wiki", "globex": "globex"}, router={"escalation": {"enabled": False}}
    )


async def query(client: Client, text: str, **extra: Any) -> Any:
    body = {"query": text, **extra}
    async with client.post("/v1/query", json=body, headers={**auth(), **FRESH}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def chat(client: Client, content: str, **extra: Any) -> Any:
    body = {"model": "auto", "messages": [{"role": "user", "content": content}], **extra}
    async with client.post("/v1/chat/completions", json=body, headers={**auth(), **FRESH}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def cited(body: dict[str, Any]) -> list[str]:
    return [c["doc_id"] for c in body["citations"]]


@pytest.mark.parametrize("route", ["auto", "direct"])
async def test_explain_photosynthesis_gets_a_cited_extractive_answer(
    client: Client, route: str
) -> None:
    body = await query(client, "Explain photosynthesis", route=route)
    assert body["route"] == "lookup" and body["extractive"] is True
    assert cited(body)[0] == "Photosynthesis"
    assert body["answer"].startswith("Photosynthesis is a system of biological processes")
    assert "[1]" in body["answer"] and NO_MODEL_TEXT not in body["answer"]
    if route == "direct":  # forced direct, and no model to answer it: looked up, and said so
        assert LOOKED_UP in body["route_reason"]


async def test_a_bare_place_name_is_looked_up_and_answered_from_the_nearest_pages(
    client: Client,
) -> None:
    # The sample has no page on Canberra: the answer quotes what it has on Australia's cities.
    body = await query(client, "Canberra")
    assert body["route"] == "lookup" and body["extractive"] is True
    assert body["citations"] and set(cited(body)) <= {"Sydney", "Australia", "New Zealand"}
    assert body["answer"].endswith("]") and NO_MODEL_TEXT not in body["answer"]


async def test_a_document_just_put_answers_the_question_about_it(client: Client) -> None:
    doc_id = f"zorblax-{uuid.uuid4().hex[:8]}"
    question = "How do I reset the Zorblax 9000?"
    before = await query(client, question, route="direct")
    # Nothing in the documents matches: nothing cited, and the answer says so.
    assert before["answer"] == NO_ANSWER_TEXT and before["citations"] == []
    text = (
        "The Zorblax 9000 is a countertop fusion kettle. To reset the Zorblax 9000, hold the "
        "power button for ten seconds until the ring light blinks twice. A reset keeps the "
        "descaling schedule."
    )
    put = {"title": "Zorblax 9000 manual", "text": text}
    async with client.put(f"/v1/documents/{doc_id}", json=put, headers=auth()) as resp:
        assert resp.status == 201, await resp.text()
    for route in ("auto", "direct"):
        body = await query(client, question, route=route)
        assert body["route"] == "lookup" and cited(body)[0] == doc_id
        assert "hold the power button for ten seconds" in body["answer"]


async def test_the_passages_searched_but_off_topic_are_not_cited(client: Client) -> None:
    # The search returns its 6 best of the 24 pages whatever they are (the dense arm always
    # ranks all of them); only the pages on the tower and its engineer clear the floor.
    body = await query(client, "Who designed the Eiffel Tower?")
    assert set(cited(body)) <= {"Eiffel Tower", "Gustave Eiffel"} and body["citations"]
    assert "Gustave Eiffel" in body["answer"]


@pytest.mark.parametrize("route", ["auto", "direct"])
async def test_small_talk_without_a_model_gets_a_short_honest_reply(
    client: Client, route: str
) -> None:
    body = await query(client, "Hello, thanks a lot!", route=route)
    assert body["route"] == "direct" and body["answer"] == NO_MODEL_TEXT
    assert body["citations"] == []


async def test_max_tokens_cuts_the_chat_answer_by_the_embedders_tokenizer(
    client: Client, served_embedder: Embedder
) -> None:
    whole = await chat(client, "Explain photosynthesis")
    cut = await chat(client, "Explain photosynthesis", max_tokens=16)
    window = token_window(served_embedder)
    assert window is not None
    text, full = cut["choices"][0]["message"]["content"], whole["choices"][0]["message"]["content"]
    assert window.count(full) > 16 >= window.count(text)
    assert cut["choices"][0]["finish_reason"] == "length"
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert text.removesuffix(" … [1]") in full


async def sse_events(client: Client, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(event name, data) of every event of a stream; the name "" for a plain data line."""
    async with client.post(path, json=body, headers={**auth(), **FRESH}) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.text()
    events = []
    for block in raw.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines and lines["data"] != "[DONE]":
            events.append((lines.get("event", ""), json.loads(lines["data"])))
    return events


async def test_query_and_chat_streams_carry_the_same_extractive_answer(client: Client) -> None:
    question = "Who invented dynamite?"
    whole = await query(client, question)
    events = await sse_events(client, "/v1/query", {"query": question, "stream": True})
    streamed = "".join(data["text"] for name, data in events if name == "delta")
    (done,) = [data for name, data in events if name == "done"]
    assert streamed == done["answer"] == whole["answer"]
    assert done["extractive"] is True and cited(done) == cited(whole)
    body = {"model": "auto", "messages": [{"role": "user", "content": question}], "stream": True}
    chunks = await sse_events(client, "/v1/chat/completions", body)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for _, c in chunks)
    assert content == whole["answer"]


async def test_a_follow_up_without_a_model_is_searched_as_written_and_says_so(
    client: Client,
) -> None:
    history = [
        {"role": "user", "content": "Tell me about the Eiffel Tower"},
        {"role": "assistant", "content": "The Eiffel Tower is a lattice tower in Paris. [1]"},
    ]
    body = await query(client, "Who designed it?", history=history)
    assert body["answer"].endswith(f"({NOT_REWRITTEN})")
    assert NOT_REWRITTEN in body["route_reason"]
    thanks = await query(client, "thanks!", history=history)  # small talk needs no rewrite
    assert thanks["answer"] == NO_MODEL_TEXT


async def test_a_capped_follow_up_keeps_its_note_out_of_the_text(
    client: Client, served_embedder: Embedder
) -> None:
    messages = [
        {"role": "user", "content": "Tell me about the Eiffel Tower"},
        {"role": "assistant", "content": "The Eiffel Tower is a lattice tower in Paris. [1]"},
        {"role": "user", "content": "Who designed it?"},
    ]
    body = {"model": "auto", "messages": messages, "max_tokens": 16}
    async with client.post("/v1/chat/completions", json=body, headers={**auth(), **FRESH}) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    window = token_window(served_embedder)
    assert window is not None
    text = answer["choices"][0]["message"]["content"]
    assert window.count(text) <= 16 and NOT_REWRITTEN not in text  # the cap holds
    assert NOT_REWRITTEN in answer["querygate"]["route_reason"]  # and the note is still said


async def test_max_tokens_cuts_the_small_talk_reply_too(
    client: Client, served_embedder: Embedder
) -> None:
    window = token_window(served_embedder)
    assert window is not None and window.count(NO_MODEL_TEXT) > 8
    cut = await chat(client, "Hello, thanks a lot!", max_tokens=8)
    text = cut["choices"][0]["message"]["content"]
    assert 0 < window.count(text) <= 8 and NO_MODEL_TEXT.startswith(text)
    assert cut["choices"][0]["finish_reason"] == "length"
    roomy = await chat(client, "Hello, thanks a lot!", max_tokens=1_000)
    assert roomy["choices"][0]["message"]["content"] == NO_MODEL_TEXT
    assert roomy["choices"][0]["finish_reason"] == "stop"
