"""Multi-turn follow-ups are rewritten before cache, classifier and retrieval see them; a tenant
whose corpus fits the budget is answered from all of it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway


def test_a_followup_is_rewritten_and_the_original_kept(gateway: GatewayProcess) -> None:
    scripted = '[[fake:{"answer": "How long is the Acme router warranty?"}]]'
    resp = requests.post(
        f"{gateway.url}/v1/query",
        json={
            "query": f"and how long does it last? {scripted}",
            "history": [
                {"role": "user", "content": f"Tell me about the Acme warranty ({uuid.uuid4()})"},
                {"role": "assistant", "content": "It covers hardware faults."},
            ],
        },
        headers=gateway.headers(),
        timeout=30,
    )
    body = resp.json()
    assert body["original_query"].startswith("and how long does it last?")
    assert body["rewritten_query"] == "How long is the Acme router warranty?"
    assert body["route"] == "lookup"
    assert "rewrite" in body["timings_ms"]
    # The answer was written for the rewritten question, and both calls are billed.
    assert "How long is the Acme router warranty?" in body["answer"]
    assert body["usage"]["by_tier"]["small"]["prompt_tokens"] > 0


def test_a_self_contained_question_is_not_rewritten(gateway: GatewayProcess) -> None:
    resp = requests.post(
        f"{gateway.url}/v1/query",
        json={
            "query": "What does the Acme warranty policy exclude from coverage?",
            "history": [{"role": "user", "content": f"hello {uuid.uuid4()}"}],
        },
        headers=gateway.headers(),
        timeout=30,
    )
    assert "original_query" not in resp.json()


@pytest.fixture
def full_context_gateway(fake_upstream: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = start_gateway(
        tmp_path,
        fake_upstream,
        router={"full_context": {"enabled": True, "max_chunks": 3, "max_tokens": 2000}},
    )
    yield gw
    stop_gateway(gw)


def test_a_small_corpus_is_answered_from_all_of_it(full_context_gateway: GatewayProcess) -> None:
    resp = requests.post(
        f"{full_context_gateway.url}/v1/query",
        json={"query": "What is the Hammerfall launch code?"},
        headers=full_context_gateway.headers("globex"),
        timeout=30,
    )
    body = resp.json()
    assert body["route"] == "full_context", body
    assert "fits the context budget" in body["route_reason"]
    assert "retrieve" not in body["timings_ms"]
