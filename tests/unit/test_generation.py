import pytest

from backends.llm.base import Completion, Message, Usage
from routers.generation import NOT_FOUND, CitationStream, finish, inert_citations
from routers.types import Citation, Generation, Route

TAG = "k7q3x9m2"
SOURCES = tuple(Citation(f"d{i}", f"d{i}#0", f"T{i}", f"text {i}", 0.1) for i in (1, 2, 3))
GEN = Generation(Route.LOOKUP, "small", (Message("user", "q"),), SOURCES, source_tag=TAG)


def m(n: int) -> str:
    """The marker issued for source n in GEN."""
    return f"[{TAG}-{n}]"


def completion(text: str, finish_reason: str = "stop") -> Completion:
    return Completion(text, "small", "m", Usage(10, 5, 0.001), finish_reason=finish_reason)


def test_issued_markers_become_the_clients_numbers_in_first_citation_order() -> None:
    answer = finish(GEN, completion(f"B {m(2)}, then A {m(1)}{m(2)}."))
    assert [c.doc_id for c in answer.citations] == ["d2", "d1"]
    assert answer.text == "B [1], then A [2][1]."


def test_a_marker_list_and_any_case_of_the_tag_are_citations() -> None:
    answer = finish(GEN, completion(f"A [{TAG}-1, {TAG.upper()}-3]."))
    assert answer.text == "A [1][2]."
    assert [c.doc_id for c in answer.citations] == ["d1", "d3"]


@pytest.mark.parametrize(
    "forged",
    ["[2]", "[1, 2]", "[a2b3c4d5-2]", f"[{TAG}-9]", f"[{TAG}-0]", "[errors.md#3]"],
    ids=["bare-number", "number-list", "other-tag", "out-of-range", "zero", "chunk-id"],
)
def test_only_a_marker_issued_in_this_request_is_a_citation(forged: str) -> None:
    answer = finish(GEN, completion(f"The refund is 90 days {forged}."))
    assert answer.citations == ()
    assert forged not in answer.text
    assert "not retrieved removed" in answer.text
    assert not answer.complete


def test_bracketed_words_are_left_alone() -> None:
    answer = finish(GEN, completion(f"It [sic] works {m(1)} [see the manual]."))
    assert answer.text == "It [sic] works [1] [see the manual]."


def test_a_generation_without_a_tag_cites_nothing() -> None:
    untagged = Generation(Route.LOOKUP, "small", (Message("user", "q"),), SOURCES)
    assert finish(untagged, completion("Paris [1].")).citations == ()


def test_a_cited_answer_is_complete_and_carries_usage() -> None:
    answer = finish(GEN, completion(f"Paris is the capital {m(3)}."))
    assert answer.complete
    assert [c.doc_id for c in answer.citations] == ["d3"]
    assert answer.usage_by_tier["small"].cost_usd == 0.001


def test_an_uncited_retrieval_answer_is_not_cacheable() -> None:
    assert not finish(GEN, completion("Paris, probably.")).complete


def test_admitting_the_sources_lack_it_is_not_cacheable() -> None:
    assert not finish(GEN, completion(f"{NOT_FOUND} {m(1)}")).complete


def test_a_truncated_answer_is_not_cacheable() -> None:
    assert not finish(GEN, completion(f"Paris {m(1)} and", finish_reason="length")).complete


def test_a_direct_answer_needs_no_citation() -> None:
    direct = Generation(Route.DIRECT, "small", (Message("user", "hi"),))
    assert finish(direct, completion("Hello!")).complete


def test_invented_numbers_and_chunk_ids_are_dropped_and_said() -> None:
    answer = finish(GEN, completion(f"Paris {m(1)}, per [9] and [errors.md#3]."))
    assert "[9]" not in answer.text and "errors.md#3" not in answer.text
    assert "2 citation(s) to sources that were not retrieved removed" in answer.text
    assert [c.doc_id for c in answer.citations] == ["d1"]


@pytest.mark.parametrize("size", [1, 3, 100])
def test_an_invented_number_opening_the_answer_is_dropped_too(size: int) -> None:
    # a document's "[2] Official policy" repeated first: the client would read it as
    # citing its second source
    text = f"[2] Official policy: refunds are instant {m(1)}."
    answer = finish(GEN, completion(text))
    assert answer.text.startswith(" Official policy: refunds are instant [1].")
    assert "1 citation(s) to sources that were not retrieved removed" in answer.text
    stream = CitationStream(GEN)
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    shown = "".join(stream.feed(p) for p in pieces) + stream.flush()
    assert shown == " Official policy: refunds are instant [1]."


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
    assert finish(earlier, completion(f"Paris {m(1)}.")).usage_estimated


STREAMED = (
    f"A {m(2)} b [sic] c [9]{m(1)}, [ {m(3)}] and [{TAG}-1, {TAG}-2] [unclosed {m(2)}. "
    f"Code: items[0] and x[12][3]; see [{TAG}-3, page 4]."
)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 11, len(STREAMED)])
def test_a_streamed_answer_is_rewritten_exactly_as_the_whole_text(size: int) -> None:
    stream = CitationStream(GEN)
    pieces = [STREAMED[i : i + size] for i in range(0, len(STREAMED), size)]
    shown = "".join(stream.feed(p) for p in pieces) + stream.flush()
    whole = finish(GEN, completion(STREAMED))
    assert whole.text.startswith(shown)
    assert "[sic]" in shown and "[9]" not in shown and TAG not in shown
    assert "items[0] and x[12][3]" in shown


def test_an_index_after_a_word_is_not_a_citation() -> None:
    answer = finish(GEN, completion(f"Use items[0] and x[12] {m(1)}."))
    assert answer.text == "Use items[0] and x[12] [1]."
    assert "removed" not in answer.text


def test_prose_mixed_into_a_bracket_of_ours_never_leaks_the_tag() -> None:
    answer = finish(GEN, completion(f"Two years [{TAG}-2, page 4]."))
    assert answer.text == "Two years [1]."
    assert [c.doc_id for c in answer.citations] == ["d2"]


def test_a_direct_stream_is_passed_through() -> None:
    stream = CitationStream(Generation(Route.DIRECT, "small", (Message("user", "hi"),)))
    assert stream.feed("Hi [1") + stream.flush() == "Hi [1"


def test_a_quoted_passage_keeps_its_text_but_no_citation_of_its_own() -> None:
    quoted = inert_citations(f"[2] says {m(1)} and [errors.md#3], items[0], x[1][2], [sic].")
    assert quoted == f"(2) says ({TAG}-1) and (errors.md#3), items[0], x[1][2], [sic]."
