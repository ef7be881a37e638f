"""The rerank stage's policy: when a search's fused hits are reranked, how, and what it records."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from backends.llm.base import ToolCall
from backends.rerank.base import RerankRequest
from backends.retrieval.base import Hit
from gateway.settings import Settings, load_settings
from routers.agent_tools import AgentTools, SearchRerank, SourceBook, ToolLimits
from routers.grading import best_possible_score
from routers.rerank import (
    RerankCall,
    RerankConfig,
    RerankStage,
    RerankTrace,
    failure_notes,
    rerank_passage,
)
from tests.fakes.rerank import FakeReranker, Recorder

BEST = best_possible_score(1.0, 1.0)
REMOTE = {"model": "cohere/fake-rerank", "api_base": "http://127.0.0.1:9/v1/rerank"}


def hit(n: int, text: str, score: float, bm25: int | None = None, dense: int | None = None) -> Hit:
    return Hit(f"d{n}", f"d{n}#0", f"Title {n}", "", text, score, bm25, dense)


# Fused best first: the top two 5% of the best's score apart (uncertain); the third
# is the one holding every word of the query.
HITS = [
    hit(1, "alpha beta", BEST * 0.80, bm25=2, dense=1),
    hit(2, "gamma", BEST * 0.76, bm25=1, dense=3),
    hit(3, "where is the lighthouse keeper", BEST * 0.50, bm25=3, dense=2),
    hit(4, "lighthouse", BEST * 0.40),
]
QUERY = "lighthouse keeper"


# The stage's mechanics, tested apart from the measured defaults (blend, keyword skip, margin):
# the reranker's order alone, the arms' agreement counted, every query eligible.
MECHANICS: dict[str, Any] = {
    "blend": 0.0,
    "skip_keyword_queries": False,
    "skip_when_arms_agree": True,
    "max_margin": 0.1,
}


def config(**fields: Any) -> RerankConfig:
    return RerankConfig(reranker="remote", remote=REMOTE, **(MECHANICS | fields))


async def run(
    stage: RerankStage, hits: list[Hit] = HITS, k: int = 3, **kw: Any
) -> tuple[list[Hit], Recorder]:
    recorder = Recorder()
    call = RerankCall("acme", QUERY, hits, k, "lookup", recorder, **kw)
    return await stage.rerank(call), recorder


async def test_an_uncertain_ranking_is_reranked_and_the_rest_follow_in_fused_order() -> None:
    fake = FakeReranker()
    kept, recorder = await run(RerankStage(config(candidates=3), fake), k=4)
    assert [h.doc_id for h in kept] == ["d3", "d1", "d2", "d4"]
    (trace,) = recorder.traces
    assert (trace.decision, trace.site, trace.candidates) == ("reranked", "lookup", 3)
    assert trace.fused_ranks == (3, 1, 2, 4)
    assert trace.margin == pytest.approx(0.05)  # (0.80 - 0.76) / 0.80
    assert len(fake.requests[0].passages) == 3


async def test_ties_keep_the_fused_order() -> None:
    kept, recorder = await run(RerankStage(config(), FakeReranker(score=lambda q, p: 0.5)))
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    assert recorder.traces[0].decision == "reranked"
    assert recorder.traces[0].fused_ranks == ()  # nothing moved


async def test_a_clear_leader_is_not_reranked() -> None:
    fake = FakeReranker()
    leading = [hit(1, "a", BEST * 0.9), hit(2, "b", BEST * 0.5), hit(3, "lighthouse keeper", 0.0)]
    kept, recorder = await run(RerankStage(config(max_margin=0.1), fake), leading)
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    assert recorder.traces[0].decision == "skipped_confident"
    assert recorder.traces[0].margin == pytest.approx(0.4 / 0.9, abs=1e-4)
    assert fake.requests == []


async def test_a_top_hit_both_arms_rank_first_is_not_reranked_unless_configured() -> None:
    agreed = [hit(1, "a", BEST * 0.80, 1, 1), *HITS[1:]]
    fake = FakeReranker()
    _, recorder = await run(RerankStage(config(), fake), agreed)
    assert recorder.traces[0].decision == "skipped_confident"
    _, recorder = await run(RerankStage(config(skip_when_arms_agree=False), fake), agreed)
    assert recorder.traces[0].decision == "reranked"


async def test_always_reranks_a_confident_ranking_too() -> None:
    leading = [hit(1, "a", BEST, 1, 1), hit(2, "lighthouse keeper", BEST * 0.1)]
    kept, recorder = await run(RerankStage(config(when="always"), FakeReranker()), leading)
    assert [h.doc_id for h in kept] == ["d2", "d1"]
    assert recorder.traces[0].decision == "reranked"


async def test_off_and_a_single_hit_skip_without_a_call() -> None:
    fake = FakeReranker()
    kept, recorder = await run(RerankStage(RerankConfig(reranker="off"), fake), k=2)
    assert [h.doc_id for h in kept] == ["d1", "d2"]
    assert recorder.traces[0] == RerankTrace("lookup", "skipped_off", "off", "", 0.05)
    _, recorder = await run(RerankStage(config(), fake), HITS[:1])
    assert recorder.traces[0].decision == "skipped_few"
    assert recorder.traces[0].margin is None
    assert fake.requests == []


async def test_a_failing_reranker_keeps_the_fused_order_and_says_why() -> None:
    kept, recorder = await run(RerankStage(config(), FakeReranker(fail=True)))
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    (trace,) = recorder.traces
    assert trace.decision == "failed" and "fake reranker is down" in trace.detail
    (note,) = failure_notes(recorder.traces)
    assert "the fused order was kept" in note


class Stalled(FakeReranker):
    async def scores(self, request: RerankRequest) -> list[float]:
        self.requests.append(request)
        await asyncio.Event().wait()
        return []


async def test_a_reranker_past_the_timeout_is_abandoned_and_the_fused_order_stands() -> None:
    stalled = Stalled()
    kept, recorder = await run(RerankStage(config(timeout_s=0.05), stalled))
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    assert recorder.traces[0].decision == "failed"
    # The reranker was told the deadline: the policy's timeout from the call's start.
    deadline = stalled.requests[0].deadline
    assert deadline is not None and deadline <= time.monotonic()


async def test_the_requests_deadline_bounds_the_call_below_the_timeout() -> None:
    fake = FakeReranker()
    soon = time.monotonic() + 0.5
    await run(RerankStage(config(timeout_s=5.0), fake), deadline=soon)
    assert fake.requests[0].deadline == soon
    _, recorder = await run(RerankStage(config(), Stalled()), deadline=time.monotonic() - 1)
    assert recorder.traces[0].decision == "failed"


async def test_a_reranker_answering_the_wrong_number_of_scores_failed() -> None:
    short = FakeReranker()
    short.score = lambda q, p: 1.0
    original = short.scores

    async def one_less(request: RerankRequest) -> list[float]:
        return (await original(request))[:-1]

    short.scores = one_less  # type: ignore[method-assign]
    _, recorder = await run(RerankStage(config(), short))
    assert recorder.traces[0].decision == "failed"
    assert "3 scores for 4 passages" in recorder.traces[0].detail


async def test_a_paid_call_is_charged_through_the_recorder() -> None:
    _, recorder = await run(RerankStage(config(), FakeReranker(price_usd=0.002)))
    assert recorder.spent == [0.002]


def test_passages_carry_the_title_and_are_cut() -> None:
    long = hit(1, "word " * 400, 1.0)
    assert rerank_passage(long, 64) == ("Title 1: " + "word " * 400)[:64]
    assert len(rerank_passage(long, 64)) == 64


async def test_passages_sent_are_cut_at_passage_chars() -> None:
    fake = FakeReranker()
    await run(RerankStage(config(passage_chars=64), fake))
    assert all(len(p) <= 64 for p in fake.requests[0].passages)
    assert fake.requests[0].passages[2] == "Title 3: where is the lighthouse keeper"


def test_a_search_fetches_the_candidates_only_when_a_reranker_is_on() -> None:
    assert RerankStage(config(candidates=20), FakeReranker()).fetch_k(6) == 20
    assert RerankStage(config(candidates=20), None).fetch_k(6) == 6
    assert RerankStage(RerankConfig(reranker="off", candidates=20), FakeReranker()).fetch_k(6) == 6


def test_a_reranker_needs_its_settings() -> None:
    with pytest.raises(ValidationError, match="needs a 'remote' section"):
        RerankConfig(reranker="remote")
    with pytest.raises(ValidationError, match="needs an 'opensearch' section"):
        RerankConfig(reranker="opensearch")
    with pytest.raises(ValidationError, match="max_margin"):
        RerankConfig(max_margin=2)


def test_the_opensearch_reranker_needs_the_opensearch_backend() -> None:
    rerank = {"reranker": "opensearch", "opensearch": {"model_id": "m-1"}}
    with pytest.raises(ValidationError, match="needs backend: opensearch"):
        Settings(retrieval={"rerank": rerank})
    assert Settings(retrieval={"backend": "opensearch", "rerank": rerank}).retrieval.rerank


class Index:
    """A retriever that returns `HITS` for any search, and remembers the k asked for."""

    name = "fixed"

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def search(self, request: Any) -> list[Hit]:
        self.asked.append(request.k)
        return HITS[: request.k]


class Embedder:
    dimension = 4

    async def embed(self, texts: Any) -> Any:
        return np.zeros((len(texts), 4), dtype=np.float32)


async def test_the_agents_search_tool_reranks_by_the_same_policy() -> None:
    index, recorder = Index(), Recorder()
    limits = ToolLimits(search_k=2, candidates=50, read_max_chunks=3, timeout_s=5, min_similarity=0)
    stage = RerankStage(config(candidates=4), FakeReranker())
    tools = AgentTools(
        "acme",
        index,
        Embedder(),
        limits,
        SourceBook(),
        SearchRerank(stage, recorder),  # type: ignore[arg-type]
    )
    result = await tools.run(ToolCall("c1", "search", {"query": QUERY, "k": 2}))
    assert result.run.status == "ok"
    assert index.asked == [4]  # the candidates fetched, two kept
    assert result.run.chunk_ids[0] == "d3#0"
    assert [(t.site, t.decision) for t in recorder.traces] == [("agent", "reranked")]


def test_the_configuration_examples_of_the_reranking_page_validate(tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "reranking.md"
    blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    kinds = []
    for n, block in enumerate(blocks):
        path = tmp_path / f"example-{n}.yaml"
        path.write_text(block, encoding="utf-8")
        kinds.append(load_settings(path).retrieval.rerank.reranker)
    assert kinds == ["remote", "opensearch"]


async def test_the_margin_is_between_documents_not_chunks_of_one() -> None:
    """Two chunks of one page lead: the margin is to the next page's best chunk."""
    same_page = [
        Hit("d1", "d1#0", "T1", "", "a", BEST * 0.80),
        Hit("d1", "d1#1", "T1", "", "b", BEST * 0.79),
        hit(2, "c", BEST * 0.40),
    ]
    _, recorder = await run(RerankStage(config(max_margin=0.3), FakeReranker()), same_page)
    assert recorder.traces[0].decision == "skipped_confident"
    assert recorder.traces[0].margin == pytest.approx(0.5)


async def test_blend_weighs_the_fused_order_against_the_reranker() -> None:
    """minmax(reranker) + blend x minmax(fused): with blend 1 a narrow reranker preference for
    the fused third does not overturn the fused first; with blend 0 it does."""
    scores = {"alpha beta": 0.9, "gamma": 0.0, "where is the lighthouse keeper": 1.0}
    fake = FakeReranker(score=lambda q, p: next(v for t, v in scores.items() if p.endswith(t)))
    kept, _ = await run(RerankStage(config(blend=1.0, candidates=3), fake))
    assert [h.doc_id for h in kept] == ["d1", "d3", "d2"]
    kept, _ = await run(RerankStage(config(blend=0.0, candidates=3), fake))
    assert [h.doc_id for h in kept] == ["d3", "d1", "d2"]


async def test_keyword_queries_keep_the_fused_order() -> None:
    fake = FakeReranker()
    stage = RerankStage(config(skip_keyword_queries=True), fake)
    kept, recorder = await run(stage)  # "lighthouse keeper": no question word
    assert recorder.traces[0].decision == "skipped_keywords"
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    recorder = Recorder()
    question = RerankCall("acme", "where is the lighthouse keeper?", HITS, 3, "lookup", recorder)
    await stage.rerank(question)
    assert recorder.traces[0].decision == "reranked"
    assert len(fake.requests) == 1


def test_the_defaults_are_the_measured_policy() -> None:
    """docs/reranking.md, "The coverage guard": 10 candidates, margin 0.1, blend 1, keyword
    queries skipped, arms' agreement not a reason to skip."""
    c = RerankConfig()
    assert (c.reranker, c.candidates, c.max_margin, c.blend) == ("local", 10, 0.1, 1.0)
    assert (c.skip_keyword_queries, c.skip_when_arms_agree, c.when) == (True, False, "uncertain")


def test_the_local_reranker_reads_the_text_alone_as_it_was_trained() -> None:
    h = hit(1, "The tower is 330 m tall.", 1.0)
    assert rerank_passage(h, 1024, titled=False) == "The tower is 330 m tall."
    assert rerank_passage(h, 1024) == "Title 1: The tower is 330 m tall."


# A confident fused ranking whose third hit is the page the question names.
NAMED = [
    Hit("d1", "d1#0", "Madrid", "", "Madrid is the capital of Spain.", BEST * 0.9),
    Hit("d2", "d2#0", "Valencia", "", "Valencia is a city in Spain.", BEST * 0.5),
    Hit("d3", "d3#0", "Spain", "", "Spain is a country in Europe.", BEST * 0.45),
]
SPAIN = "What is the population of Spain?"


async def named_run(stage: RerankStage, query: str = SPAIN) -> tuple[list[Hit], Recorder]:
    recorder = Recorder()
    return await stage.rerank(RerankCall("acme", query, NAMED, 3, "lookup", recorder)), recorder


async def test_a_confident_ranking_puts_the_page_the_query_names_first_without_a_call() -> None:
    """minmax(fused) + title_weight: Spain's 0 passes Madrid's 1 only with a weight above 1;
    with 0.5 it still passes Valencia's 0.11."""
    fake = FakeReranker()
    kept, recorder = await named_run(RerankStage(config(title_weight=1.5), fake))
    assert [h.doc_id for h in kept] == ["d3", "d1", "d2"]
    (trace,) = recorder.traces
    assert (trace.decision, trace.fused_ranks, trace.candidates) == (
        "skipped_confident",
        (3, 1, 2),
        0,
    )
    assert fake.requests == []
    kept, _ = await named_run(RerankStage(config(title_weight=0.5), fake))
    assert [h.doc_id for h in kept] == ["d1", "d3", "d2"]  # named, but not by enough


async def test_titles_are_not_read_with_weight_0_for_keyword_queries_or_with_the_reranker_off() -> (
    None
):
    for stage, query in (
        (RerankStage(config(title_weight=0.0), FakeReranker()), SPAIN),
        (RerankStage(config(title_weight=5.0), FakeReranker()), "Spain population"),
        (RerankStage(RerankConfig(reranker="off", title_weight=5.0), FakeReranker()), SPAIN),
    ):
        kept, recorder = await named_run(stage, query)
        assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
        assert recorder.traces[0].fused_ranks == ()


async def test_a_reranked_order_adds_the_title_term() -> None:
    """The reranker prefers Valencia; the named page comes first only with the title term."""
    fake = FakeReranker(score=lambda q, p: float(p.startswith("Valencia")))
    stage = RerankStage(config(when="always", blend=0.0, title_weight=0.0), fake)
    kept, _ = await named_run(stage)
    assert kept[0].doc_id == "d2"
    stage = RerankStage(config(when="always", blend=0.0, title_weight=1.5), fake)
    kept, recorder = await named_run(stage)
    assert [h.doc_id for h in kept] == ["d3", "d2", "d1"]
    assert recorder.traces[0].decision == "reranked"


def test_the_title_weight_default_is_the_measured_one() -> None:
    """docs/reranking.md, "The title signal": 0.5 on the calibration fold."""
    assert RerankConfig().title_weight == 0.5


# A question that describes its page and names another: the fused first holds all of it.
MOMBASA = "Which coastal city in southeastern Kenya along the Indian Ocean?"
DESCRIBED = [
    Hit(
        "d1",
        "d1#0",
        "Mombasa",
        "",
        "Mombasa is a coastal city in southeastern Kenya along the Indian Ocean.",
        BEST * 0.9,
    ),
    Hit("d2", "d2#0", "Kenya", "", "Kenya is a country in East Africa.", BEST * 0.85),
    Hit(
        "d3", "d3#0", "Indian Ocean", "", "The Indian Ocean is the third-largest ocean.", BEST * 0.1
    ),
]


async def described_run(stage: RerankStage, query: str = MOMBASA) -> list[Hit]:
    kept, _ = await described_traced(stage, query)
    return kept


async def described_traced(
    stage: RerankStage, query: str = MOMBASA
) -> tuple[list[Hit], RerankTrace]:
    recorder = Recorder()
    kept = await stage.rerank(RerankCall("acme", query, DESCRIBED, 3, "lookup", recorder))
    (trace,) = recorder.traces
    return list(kept), trace


async def test_a_reranked_order_keeps_first_the_fused_hit_holding_the_whole_question() -> None:
    prefers_kenya = FakeReranker(score=lambda q, p: float(p.startswith("Kenya")))
    guarded = RerankStage(config(when="always", blend=0.0, title_weight=1.5), prefers_kenya)
    kept, trace = await described_traced(guarded)
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    assert (trace.decision, trace.full_match_kept, trace.fused_ranks) == ("reranked", True, ())
    unguarded = RerankStage(
        config(when="always", blend=0.0, title_weight=1.5, keep_full_match=False), prefers_kenya
    )
    kept, trace = await described_traced(unguarded)
    assert [h.doc_id for h in kept] == ["d2", "d3", "d1"]
    assert (trace.full_match_kept, trace.fused_ranks) == (False, (2, 3, 1))


async def test_the_title_term_alone_keeps_first_the_fused_hit_holding_the_whole_question() -> None:
    fake = FakeReranker()
    stage = RerankStage(config(max_margin=0.0, title_weight=5.0), fake)
    kept, trace = await described_traced(stage)
    assert [h.doc_id for h in kept] == ["d1", "d2", "d3"]
    assert (trace.decision, trace.full_match_kept) == ("skipped_confident", True)
    assert fake.requests == []  # skipped as confident: the title term's reorder alone
    off = RerankStage(config(max_margin=0.0, title_weight=5.0, keep_full_match=False), fake)
    assert [h.doc_id for h in await described_run(off)] == ["d2", "d3", "d1"]


async def test_the_guard_waits_for_enough_words() -> None:
    prefers_kenya = FakeReranker(score=lambda q, p: float(p.startswith("Kenya")))
    stage = RerankStage(config(when="always", blend=0.0), prefers_kenya)
    # Two content words ("coastal", "kenya"): under the default minimum the guard is not asked.
    assert (await described_run(stage, "Coastal Kenya?"))[0].doc_id == "d2"
    strict = RerankStage(config(when="always", blend=0.0, full_match_min_words=2), prefers_kenya)
    # Kenya's passage (its title counted) holds "kenya" but not "coastal": Mombasa stays first.
    assert (await described_run(strict, "Coastal Kenya?"))[0].doc_id == "d1"


async def test_a_hit_that_also_holds_the_whole_question_may_go_first() -> None:
    """Both Mombasa's and Kenya's passages hold "Kenya" and "coastal" here (Kenya's title and
    text): the guard does not hold Mombasa first."""
    hits = [
        DESCRIBED[0],
        Hit("d2", "d2#0", "Kenya", "", "Kenya is a coastal country of East Africa.", BEST * 0.85),
    ]
    prefers_kenya = FakeReranker(score=lambda q, p: float(p.startswith("Kenya")))
    stage = RerankStage(config(when="always", blend=0.0, full_match_min_words=2), prefers_kenya)
    recorder = Recorder()
    kept = await stage.rerank(RerankCall("acme", "Coastal Kenya?", hits, 2, "lookup", recorder))
    assert [h.doc_id for h in kept] == ["d2", "d1"]
    assert recorder.traces[0].full_match_kept is False


async def test_a_title_counts_toward_the_whole_match() -> None:
    """The fused first's text lacks "Mombasa"; its title holds it, so the question is held."""
    hits = [
        Hit("d1", "d1#0", "Mombasa", "", "A coastal city in southeastern Kenya.", BEST * 0.9),
        Hit("d2", "d2#0", "Kenya", "", "Kenya is a country in East Africa.", BEST * 0.85),
    ]
    prefers_kenya = FakeReranker(score=lambda q, p: float(p.startswith("Kenya")))
    stage = RerankStage(config(when="always", blend=0.0, full_match_min_words=2), prefers_kenya)
    recorder = Recorder()
    kept = await stage.rerank(
        RerankCall("acme", "Mombasa coastal city?", hits, 2, "lookup", recorder)
    )
    assert [h.doc_id for h in kept] == ["d1", "d2"]
    assert recorder.traces[0].full_match_kept is True


def test_the_guard_is_on_by_default_from_four_words() -> None:
    """docs/reranking.md, "The coverage guard": chosen on the tuning parts."""
    c = RerankConfig()
    assert (c.keep_full_match, c.full_match_min_words) == (True, 4)


def test_a_guard_minimum_under_one_word_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="full_match_min_words"):
        RerankConfig(full_match_min_words=0)
    with pytest.raises(ValidationError, match="keep_full_match"):
        RerankConfig.model_validate({"keep_full_match": "sometimes"})
