"""The router's generated data: deterministic generation (byte-identical), the committed files
match their generator, and the style-shifted set shares no template with the training file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from gateway.ingest.wiki_sample import load_wiki_sample
from scripts.generate_router_data import EVAL_FILE, TRAIN_FILE, generate, main
from scripts.train_router import (
    STYLE_SHIFT_PATH,
    expected_calibration_error,
    fanoutqa_path,
    fit_temperature,
    style_shift_examples,
)


def test_generating_twice_writes_the_same_bytes(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        out.mkdir()
        main(["--out-dir", str(out)])
    for name in (TRAIN_FILE, EVAL_FILE):
        assert (first / name).read_bytes() == (second / name).read_bytes()
        committed = STYLE_SHIFT_PATH.with_name(name).read_bytes()
        assert hashlib.sha256((first / name).read_bytes()).digest() == (
            hashlib.sha256(committed).digest()
        ), f"{name} is stale: python scripts/generate_router_data.py"


def test_style_shifted_set_shares_no_text_with_training_and_has_all_classes() -> None:
    docs = load_wiki_sample()[:3000]
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    train = {r["text"].casefold() for r in generate("train", docs, dev)}
    held_out = style_shift_examples()
    assert {str(e.route) for e in held_out} == {"direct", "lookup", "multihop"}
    assert not train & {e.text.casefold() for e in held_out}


def test_temperature_recovers_a_known_scale_and_lowers_calibration_error() -> None:
    rng = np.random.default_rng(0)
    true_logits = rng.normal(size=(4000, 3)) * 2
    y = np.array([rng.choice(3, p=np.exp(r) / np.exp(r).sum()) for r in true_logits])
    overconfident = true_logits * 3
    t = fit_temperature(overconfident, y)
    assert 2.5 < t < 3.5

    def probs(logits: np.ndarray) -> np.ndarray:
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    assert expected_calibration_error(probs(overconfident / t), y) < expected_calibration_error(
        probs(overconfident), y
    )
