"""The retrieval benchmark's metrics on tiny hand-made rankings; the benchmark is not run."""

import math

from bench.retrieval_eval import (
    best_chunk_per_doc,
    first_relevant_rank,
    mrr_at_k,
    recall_at_k,
)


def test_first_relevant_rank_is_one_based_position_of_the_first_chunk_of_the_page() -> None:
    assert first_relevant_rank(["a", "b", "c", "b"], "b") == 2


def test_first_relevant_rank_is_none_when_the_page_is_absent_or_below_the_depth() -> None:
    assert first_relevant_rank(["a", "b"], "z") is None
    assert first_relevant_rank(["a", "b", "c"], "c", depth=2) is None


def test_recall_at_k_counts_queries_whose_page_is_within_the_top_k() -> None:
    ranks = [1, 3, None, 10]
    assert recall_at_k(ranks, 1) == 0.25
    assert recall_at_k(ranks, 5) == 0.5
    assert recall_at_k(ranks, 10) == 0.75


def test_mrr_averages_reciprocal_ranks_with_misses_as_zero() -> None:
    assert mrr_at_k([1, 2, None, 4]) == (1 + 0.5 + 0 + 0.25) / 4


def test_mrr_ignores_ranks_below_k() -> None:
    assert mrr_at_k([1, 11], k=10) == 0.5


def test_metrics_of_no_queries_are_nan_not_zero() -> None:
    assert math.isnan(recall_at_k([], 10))
    assert math.isnan(mrr_at_k([]))


def test_best_chunk_per_doc_keeps_each_page_at_its_first_position() -> None:
    assert best_chunk_per_doc(["a", "a", "b", "a", "c", "b"]) == ["a", "b", "c"]


def test_dedup_lifts_a_page_crowded_out_by_another_pages_chunks() -> None:
    ranking = ["a", "a", "a", "b"]
    assert first_relevant_rank(ranking, "b", depth=3) is None
    assert first_relevant_rank(best_chunk_per_doc(ranking), "b", depth=3) == 2
