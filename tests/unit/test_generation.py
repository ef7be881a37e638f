from backends.llm.base import Completion, Message, Usage
from routers.generation import NOT_FOUND, cited_sources, finish
from routers.types import Citation, Generation, Route

SOURCES = tuple(Citation(f"d{i}", f"d{i}#0", f"T{i}", f"text {i}", 0.1) for i in (1, 2, 3))
GEN = Generation(Route.LOOKUP, "small", (Message("user", "q"),), SOURCES)


def completion(text: str, finish_reason: str = "stop") -> Completion:
    return Completion(text, "small", "m", Usage(10, 5, 0.001), finish_reason=finish_reason)


def test_cited_sources_follow_first_citation_order_and_skip_unknown_numbers() -> None:
    cited = cited_sources("B [2], then A [1][2], and [9] is not a source", SOURCES)
    assert [c.doc_id for c in cited] == ["d2", "d1"]


def test_a_cited_answer_is_complete_and_carries_usage() -> None:
    answer = finish(GEN, completion("Paris is the capital [3]."))
    assert answer.complete
    assert [c.doc_id for c in answer.citations] == ["d3"]
    assert answer.usage_by_tier["small"].cost_usd == 0.001


def test_an_uncited_retrieval_answer_is_not_cacheable() -> None:
    assert not finish(GEN, completion("Paris, probably.")).complete


def test_admitting_the_sources_lack_it_is_not_cacheable() -> None:
    assert not finish(GEN, completion(f"{NOT_FOUND} [1]")).complete


def test_a_truncated_answer_is_not_cacheable() -> None:
    assert not finish(GEN, completion("Paris [1] and", finish_reason="length")).complete


def test_a_direct_answer_needs_no_citation() -> None:
    direct = Generation(Route.DIRECT, "small", (Message("user", "hi"),))
    assert finish(direct, completion("Hello!")).complete


def test_invented_numbers_and_chunk_ids_are_dropped_and_said() -> None:
    answer = finish(GEN, completion("Paris [1], per [9] and [errors.md#3]."))
    assert "[9]" not in answer.text and "errors.md#3" not in answer.text
    assert "2 citation(s) to sources that were not retrieved removed" in answer.text
    assert [c.doc_id for c in answer.citations] == ["d1"]


def test_a_sourced_route_without_sources_is_never_complete() -> None:
    bare = Generation(Route.MULTIHOP, "large", (Message("user", "q"),))
    answer = finish(bare, completion("It is 42 [3]."))
    assert "[3]" not in answer.text
    assert not answer.complete


def test_an_empty_answer_becomes_not_found() -> None:
    answer = finish(GEN, completion("  "))
    assert answer.text == NOT_FOUND
    assert not answer.complete


def test_a_streamed_estimate_earlier_in_the_loop_stays_flagged() -> None:
    earlier = Generation(
        Route.MULTIHOP, "large", (Message("user", "q"),), SOURCES, usage_estimated=True
    )
    assert finish(earlier, completion("Paris [1].")).usage_estimated
