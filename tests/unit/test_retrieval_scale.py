"""bench/retrieval_scale.py's exact search, the truth its k-NN recall is read against: block by
block it must find the same top 10 as one sort of every chunk's cosine."""

from __future__ import annotations

import numpy as np
import pytest

from backends.retrieval.base import Chunk, Document
from bench import retrieval_scale
from bench.retrieval_scale import RECALL_K, exact_top


def _documents(vectors: np.ndarray) -> list[Document]:
    return [
        Document(f"d{i}", f"t{i}", f"h{i}", (Chunk(f"d{i}#0", "text", "", vector),))
        for i, vector in enumerate(vectors)
    ]


@pytest.mark.parametrize("block", [7, 64, 1000])  # blocks smaller than k, uneven, one block
def test_the_exact_top_matches_one_sort_of_every_cosine(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(250, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[[0, 17, 249]] + rng.normal(0, 0.1, (3, 16)).astype(np.float32)
    monkeypatch.setattr(retrieval_scale, "EXACT_BLOCK", block)
    expected = [{f"d{i}#0" for i in np.argsort(-(vectors @ q))[:RECALL_K]} for q in queries]
    assert exact_top(_documents(vectors), queries) == expected
