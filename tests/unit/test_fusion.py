"""The fusion math both backends share (`backends.retrieval.base.fuse`)."""

from __future__ import annotations

import pytest

from backends.retrieval.base import (
    MINMAX_FLOOR,
    PEAK_WEIGHT,
    RRF_K,
    ArmRanking,
    fuse,
    peak,
    rrf_fuse,
)
from routers.grading import best_possible_score

SCALE = 1 / (RRF_K + 1)


def test_rrf_is_the_weighted_reciprocal_rank_sum() -> None:
    arms = [ArmRanking(["a", "b"], [9.0, 3.0], 2.0), ArmRanking(["b", "c"], [0.9, 0.1], 0.5)]
    fused = dict(fuse(arms, "rrf"))
    assert fused["a"] == pytest.approx(2 / (RRF_K + 1))
    assert fused["b"] == pytest.approx(2 / (RRF_K + 2) + 0.5 / (RRF_K + 1))
    assert fuse(arms, "rrf") == rrf_fuse([(["a", "b"], 2.0), (["b", "c"], 0.5)])


def test_minmax_scales_each_arm_to_unit_range_and_a_miss_adds_nothing() -> None:
    """The lowest candidate scales to MINMAX_FLOOR, not 0 (as neural-search's min_max does):
    found last still beats not found."""
    bm25 = ArmRanking(["a", "b", "c"], [12.0, 7.0, 2.0], 1.0)
    dense = ArmRanking(["c", "d"], [0.9, 0.5], 0.5)
    fused = dict(fuse([bm25, dense], "minmax"))
    assert fused["a"] == pytest.approx(1.0 * SCALE)
    assert fused["b"] == pytest.approx(0.5 * SCALE)
    assert fused["c"] == pytest.approx((MINMAX_FLOOR + 0.5 * 1.0) * SCALE)
    assert fused["d"] == pytest.approx(0.5 * MINMAX_FLOOR * SCALE)


def test_minmax_ignores_each_arms_scale_and_offset() -> None:
    """An engine that reports (1 + cos) / 2 instead of cos, or BM25 x 10, ranks the same."""
    bm25 = ArmRanking(["a", "b", "c"], [3.0, 2.5, 1.0])
    dense = ArmRanking(["c", "b", "a"], [0.8, 0.6, 0.1])
    moved = [
        ArmRanking(bm25.ids, [10 * s for s in bm25.scores]),
        ArmRanking(dense.ids, [(1 + s) / 2 for s in dense.scores]),
    ]
    assert dict(fuse([bm25, dense], "minmax")) == pytest.approx(dict(fuse(moved, "minmax")))


def test_a_chunk_both_arms_rank_first_scores_the_graders_best_possible() -> None:
    """`routers.grading` reads agreement against (lexical + dense weight) / (k + 1)."""
    for method in ("rrf", "minmax", "minmax_peak"):
        arms = [ArmRanking(["a", "b"], [5.0, 1.0], 2.0), ArmRanking(["a", "b"], [0.9, 0.8], 1.0)]
        top, score = fuse(arms, method)[0]
        assert top == "a"
        assert score == pytest.approx(best_possible_score(2.0, 1.0))


def test_one_candidate_or_equal_scores_normalise_to_one() -> None:
    fused = fuse([ArmRanking(["a"], [4.2]), ArmRanking(["b", "c"], [0.5, 0.5])], "minmax")
    assert [i for i, _ in fused] == ["a", "b", "c"]
    assert [s for _, s in fused] == pytest.approx([SCALE] * 3)


def test_zscore_standardises_and_a_miss_adds_the_arms_lowest() -> None:
    bm25 = ArmRanking(["a", "b"], [3.0, 1.0])  # z = +1, -1
    dense = ArmRanking(["b", "c", "d"], [3.0, 2.0, 1.0])  # z = +1.22, 0, -1.22
    fused = dict(fuse([bm25, dense], "zscore"))
    z = 1.5**0.5
    assert fused["a"] == pytest.approx((1 - z) * SCALE)  # dense missed a: its lowest, -z
    assert fused["b"] == pytest.approx((-1 + z) * SCALE)
    assert fused["c"] == pytest.approx((-1 + 0) * SCALE)  # bm25 missed c: its lowest, -1


def test_zero_weight_silences_an_arm_and_ties_break_by_id() -> None:
    for method in ("rrf", "minmax", "zscore", "minmax_peak"):
        arms = [ArmRanking(["b", "a"], [2.0, 1.0], 0.0), ArmRanking(["a", "b"], [1.0, 1.0])]
        assert [i for i, _ in fuse(arms, method)] == ["a", "b"], method


def test_no_arms_fuse_to_nothing() -> None:
    assert fuse([], "minmax") == []
    assert fuse([ArmRanking([], [])], "zscore") == []


def test_peak_is_the_best_candidates_scaled_margin() -> None:
    assert peak([10.0, 6.0, 2.0]) == pytest.approx(0.5)
    assert peak([0.61, 0.60, 0.20]) == pytest.approx(0.01 / 0.41)
    assert peak([3.0, 3.0]) == 0.0
    assert peak([4.2]) == 1.0
    assert peak([]) == 0.0


def test_minmax_peak_trusts_the_arm_that_singles_a_chunk_out() -> None:
    """BM25 finds one page decisively (a rare identifier), the dense arm's top three are
    near-equal and miss it: plain min-max ranks the dense arm's favourite, which BM25 also
    found, first; with peak weights BM25's page stays first."""
    bm25 = ArmRanking(["page", "near", "x"], [20.0, 9.0, 8.0])
    dense = ArmRanking(["near", "y", "z"], [0.46, 0.455, 0.45])
    assert fuse([bm25, dense], "minmax")[0][0] == "near"
    assert fuse([bm25, dense], "minmax_peak")[0][0] == "page"
    weights = 1 + PEAK_WEIGHT * 11 / 12, 1 + PEAK_WEIGHT * 0.5
    factor = 2 / sum(weights)
    fused = dict(fuse([bm25, dense], "minmax_peak"))
    assert fused["page"] == pytest.approx(weights[0] * factor * SCALE)


def test_minmax_peak_is_minmax_when_the_arms_are_equally_peaked() -> None:
    bm25 = ArmRanking(["a", "b", "c"], [9.0, 5.0, 1.0], 2.0)
    dense = ArmRanking(["c", "b", "d"], [0.9, 0.7, 0.5])
    assert dict(fuse([bm25, dense], "minmax_peak")) == pytest.approx(
        dict(fuse([bm25, dense], "minmax"))
    )
