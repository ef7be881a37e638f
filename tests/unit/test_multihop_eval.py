"""The multi-hop bench's scripted planner and metrics on a three-document index: every gold
search in one turn, run concurrently by the loop, and evidence recall counted by page."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.embeddings.minilm import MiniLMEmbedder
from backends.llm.base import LLMCall, Message
from backends.retrieval.base import Hit, SearchRequest
from backends.retrieval.embedded import EmbeddedRetriever
from bench.multihop_eval import (
    Harness,
    Prices,
    Question,
    ScriptedPlanner,
    evidence_recall,
    loose_accuracy,
)
from bench.retrieval_eval import TENANT
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import RawDocument
from routers.agent_caps import AgentConfig
from routers.agent_tools import TOOL_SPECS
from routers.learned import LearnedClassifier

PRICES = Prices((0.15e-6, 0.60e-6), (2.5e-6, 10e-6))
DOCS = [
    RawDocument(
        "Marie Curie",
        "Marie Curie",
        "Marie Curie was a physicist and chemist who won Nobel Prizes in physics and chemistry. "
        "She was born in Warsaw in 1867.",
    ),
    RawDocument(
        "Warsaw", "Warsaw", "Warsaw is the capital and largest city of Poland, on the Vistula."
    ),
    RawDocument(
        "Sourdough",
        "Sourdough",
        "Sourdough bread is leavened by fermenting dough with wild yeast and lactobacilli.",
    ),
]
QUESTION = Question(
    text="Marie Curie was born in the capital of which country?",
    group="p1",
    plan=("Where was Marie Curie born?", "Which country is Warsaw the capital of?"),
    evidence=frozenset({"Marie Curie", "Warsaw"}),
    answer="Poland",
)


class CountingIndex:
    """An index whose searches wait (up to a bound) until `expected` of them are in flight, so
    concurrent searches all meet there, whatever the embedder's speed, and sequential ones
    never do."""

    def __init__(self, inner: EmbeddedRetriever, expected: int) -> None:
        self.name = inner.name
        self._inner = inner
        self._expected = expected
        self._all_in = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def search(self, request: SearchRequest) -> list[Hit]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.in_flight >= self._expected:
            self._all_in.set()
        try:
            # Well within the tools' 5 s timeout: a sequential loop still gets its answers.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._all_in.wait()
            return await self._inner.search(request)
        finally:
            self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture
async def index(tmp_path: Path, minilm: MiniLMEmbedder) -> AsyncIterator[CountingIndex]:
    retriever = EmbeddedRetriever(tmp_path / "index.sqlite3")
    await ingest_documents(TENANT, DOCS, minilm, retriever)
    yield CountingIndex(retriever, expected=len(QUESTION.plan))
    await retriever.aclose()


def test_evidence_recall_is_the_share_of_evidence_pages_found() -> None:
    assert evidence_recall(frozenset({"A", "B"}), ["A", "C", "A"]) == 0.5


def test_loose_accuracy_does_not_count_a_citation_as_a_number() -> None:
    assert loose_accuracy({"Pat Burrell": "Right"}, "Pat Burrell bats right [1].") == 1.0
    assert loose_accuracy(1, "See the passage [1].") == 0.0


async def test_scripted_planner_issues_every_gold_search_in_its_first_turn() -> None:
    planner = ScriptedPlanner(QUESTION.plan, PRICES)
    messages = (Message("system", "tools"), Message("user", QUESTION.text))
    completion = await planner.complete(LLMCall("large", messages, tools=TOOL_SPECS))
    assert [(c.name, c.arguments["query"]) for c in completion.tool_calls] == [
        ("search", q) for q in QUESTION.plan
    ]
    assert completion.usage.cost_usd > 0


async def test_multihop_run_searches_concurrently_and_finds_both_evidence_pages(
    index: CountingIndex, minilm: MiniLMEmbedder
) -> None:
    vector = (await minilm.embed([QUESTION.text]))[0]
    harness = Harness(
        retriever=index,
        embedder=minilm,
        classifier=LearnedClassifier.load(embedding_model_id=minilm.model_id),
        vectors={QUESTION.text: vector},
        # thin_below=1: no reads, so one search turn, then the answer.
        llm_for=lambda q: ScriptedPlanner(q.plan, PRICES, thin_below=1),
    )
    run = await harness.run(QUESTION, "always-multihop", AgentConfig())
    assert index.most_in_flight == 2  # both searches of the one turn overlapped
    assert (run.model_calls, run.tool_calls) == (2, 2)
    assert evidence_recall(QUESTION.evidence, run.shown) == 1.0
    assert evidence_recall(QUESTION.evidence, run.cited) == 1.0
    assert "Sourdough" not in run.shown  # relevance grading dropped the unrelated page
