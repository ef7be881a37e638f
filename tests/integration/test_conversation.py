"""Multi-turn follow-ups are rewritten before cache, classifier and retrieval see them; a tenant
whose corpus fits the budget is answered from all of it. The app in process, its model a
`FakeLLM` that answers the rewrite call with a scripted question and echoes the rest."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.fakes.llm import Call, FakeLLM, echo
from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")

REWRITTEN = "How long is the Acme router warranty?"


def rewrites(call: Call) -> str:
    return REWRITTEN if call.route == "rewrite" else echo(call)


@pytest.fixture(scope="module")
def llm() -> FakeLLM:
    return FakeLLM(rewrites)


@pytest.fixture(scope="module")
async def client(app_client: OpenClient, llm: FakeLLM) -> Client:
    return await app_client(llm=llm)


async def ask(client: Client, tenant: str = "acme", **body: Any) -> Any:
    async with client.post("/v1/query", json=body, headers=auth(tenant)) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_a_followup_is_rewritten_and_the_original_kept(client: Client, llm: FakeLLM) -> None:
    history = [
        {"role": "user", "content": f"Tell me about the Acme warranty ({uuid.uuid4()})"},
        {"role": "assistant", "content": "It covers hardware faults."},
    ]
    body = await ask(client, query="and how long does it last?", history=history)
    assert body["original_query"] == "and how long does it last?"
    assert body["rewritten_query"] == REWRITTEN
    assert body["route"] == "lookup"
    assert "rewrite" in body["timings_ms"]
    # The answer was written for the rewritten question, and both calls are billed.
    assert REWRITTEN in body["answer"]
    assert body["usage"]["by_tier"]["small"]["prompt_tokens"] > 0
    rewrite = next(c for c in llm.calls if c.route == "rewrite")
    assert "and how long does it last?" in rewrite.prompt


async def test_a_self_contained_question_is_not_rewritten(client: Client) -> None:
    body = await ask(
        client,
        query="What does the Acme warranty policy exclude from coverage?",
        history=[{"role": "user", "content": f"hello {uuid.uuid4()}"}],
    )
    assert "original_query" not in body


async def test_a_small_corpus_is_answered_from_all_of_it(app_client: OpenClient) -> None:
    full_context = {"enabled": True, "max_chunks": 3, "max_tokens": 2000}
    client = await app_client(llm=FakeLLM(), router={"full_context": full_context})
    body = await ask(client, "globex", query="What is the Hammerfall launch code?")
    assert body["route"] == "full_context", body
    assert "fits the context budget" in body["route_reason"]
    assert "retrieve" not in body["timings_ms"]
