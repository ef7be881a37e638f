"""bench/rerank_eval.py's verdict and policy choice, bench/rerank_candidates.py's list names;
nothing is run."""

import json
from pathlib import Path

import numpy as np
import pytest

from bench.rerank_candidates import (
    EMBEDDED,
    STYLE_PARTS,
    STYLE_SPLITS,
    _check_style_cache,
    list_name,
)
from bench.rerank_eval import Policy, best_policies, verdict


def test_the_embedded_lists_keep_their_names_and_a_nodes_carry_its_backend() -> None:
    assert list_name(EMBEDDED, "fanoutqa", "held-out") == "fanoutqa-held-out"
    assert list_name("opensearch-3.5.0", "style", "part4") == "opensearch-3.5.0-style-part4"


def test_a_policy_that_changes_nothing_is_not_below_fusion() -> None:
    zeros = np.zeros(4)
    assert verdict(zeros, zeros, ["a", "b", "c", "d"]).endswith(": not below fusion")


def test_a_negative_mean_difference_is_below_fusion_whatever_its_interval() -> None:
    d_r1 = np.array([-1.0, 1.0, 0.0, -1.0])
    d_rr = np.array([0.5, 0.0, 0.0, 0.0])
    said = verdict(d_r1, d_rr, ["a", "b", "c", "d"])
    assert said.endswith("below fusion on R@1")


def test_a_loss_in_every_group_has_its_interval_below_zero() -> None:
    loss = np.array([-1.0, -0.5, -1.0, -0.5])
    said = verdict(loss, loss, ["a", "b", "c", "d"])
    assert said.endswith("below fusion on R@1, MRR@10 (interval below 0 on R@1, MRR@10)")


def test_the_chosen_policy_is_the_one_whose_worst_benchmark_gains_most() -> None:
    big_but_hurts = Policy(10, 64, 0.5, 1.0)
    safe = Policy(10, 64, 0.2, 1.0)
    same_but_dearer = Policy(20, 64, 0.2, 1.0)
    gains = {big_but_hurts: [0.2, -0.01], same_but_dearer: [0.05, 0.0], safe: [0.05, 0.0]}
    lines = best_policies(gains)
    assert [line.split("  worst")[0] for line in lines] == [
        safe.label(),
        same_but_dearer.label(),
        big_but_hurts.label(),
    ]


def test_a_cached_style_list_of_another_part_is_refused(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in STYLE_PARTS["part4"].read_text("utf-8").splitlines()]
    mine = [{"query": r["query"], "page": r["page"]} for r in rows[:3]]
    _check_style_cache(tmp_path / "list.json", mine, "part4")  # fewer is fine
    for foreign in (
        {"query": "a query of the first part", "page": mine[0]["page"]},
        {"query": mine[0]["query"], "page": "another page"},
    ):
        with pytest.raises(SystemExit, match="not the style benchmark's part4"):
            _check_style_cache(tmp_path / "list.json", [*mine, foreign], "part4")


def test_the_style_splits_hold_every_part_once_and_hold_out_the_last() -> None:
    tuning, held_out = STYLE_SPLITS["tuning"], STYLE_SPLITS["held-out"]
    assert sorted((*tuning, *held_out)) == sorted(STYLE_PARTS)
    assert not set(tuning) & set(held_out)
    assert held_out == (list(STYLE_PARTS)[-1],)
