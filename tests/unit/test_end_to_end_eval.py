"""The end-to-end bench's scoring on hand-made /v1/query answers; the bench is not run."""

from typing import Any

from bench.end_to_end_eval import (
    Case,
    Served,
    citation_rank,
    latency_lines,
    recall_values,
    served_from,
)


def body(doc_ids: list[str], **extra: Any) -> dict[str, Any]:
    citations = [{"doc_id": d, "chunk_id": f"{d}#{i}"} for i, d in enumerate(doc_ids)]
    timings = {"total": 20.0, "rerank": 0.0}
    return {
        "citations": citations,
        "route": "lookup",
        "escalated": False,
        "timings_ms": timings,
        **extra,
    }


def case(page: str) -> Case:
    return Case("q", page, page, "title")


def test_an_answer_is_scored_by_its_cited_documents_in_citation_order() -> None:
    served = served_from(body(["Erbium", "Holmium"]))
    assert served.cited == ("Erbium", "Holmium")
    assert citation_rank(served, "Erbium") == 1
    assert citation_rank(served, "Holmium") == 2


def test_two_chunks_of_one_document_are_one_place_among_the_cited_documents() -> None:
    served = served_from(body(["Holmium", "Holmium", "Erbium"]))
    assert citation_rank(served, "Erbium") == 2


def test_an_answer_citing_nothing_or_another_page_has_no_rank() -> None:
    assert citation_rank(served_from(body([])), "Erbium") is None
    assert citation_rank(served_from(body(["Holmium"])), "Erbium") is None


def test_recall_counts_the_page_among_the_first_k_cited_documents() -> None:
    answers = [
        Served(("A",), "lookup", False, "", 20.0, 0.0),
        Served(("B", "B", "C", "A"), "lookup", False, "", 20.0, 0.0),
        Served(("B", "C", "D", "A"), "lookup", False, "", 20.0, 0.0),
        Served((), "lookup", False, "", 20.0, 0.0),
    ]
    cases = [case("A")] * 4
    assert recall_values(answers, cases, 1).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert recall_values(answers, cases, 3).tolist() == [1.0, 1.0, 0.0, 0.0]


def test_the_lookup_searchs_rerank_decision_is_read_not_the_agents() -> None:
    traces = [
        {"site": "agent", "decision": "reranked"},
        {"site": "lookup", "decision": "skipped_confident"},
    ]
    served = served_from(body(["A"], route="lookup", debug={"rerank": traces}))
    assert served.rerank == "skipped_confident"
    assert served_from(body(["A"])).rerank == ""


def test_the_latency_table_says_what_the_default_policy_adds_at_p50() -> None:
    def answers(*totals: float) -> list[Served]:
        return [Served(("A",), "lookup", False, "", t, 0.0) for t in totals]

    lines = latency_lines(
        {"default": {"fanoutqa": answers(10, 30, 200)}, "fused": {"fanoutqa": answers(9, 20, 21)}}
    )
    added = "  fanoutqa: the default policy adds +10.0 ms at p50 (target: at most +15 ms)"
    assert lines[-1] == added
    assert served_from(body(["A"])).total_ms == 20.0
