"""The local cross-encoder: the graph built from the wheel plus the shipped delta scores as the
training forward did, orders real sample passages, and keeps the seam's contract."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from backends.embeddings.minilm import default_model_path
from backends.errors import BackendUnavailable
from backends.rerank.base import RerankRequest
from backends.rerank.graph import DELTA_PATH, load_delta, main
from backends.rerank.local import LocalCrossEncoder
from gateway.ingest.wiki_sample import load_wiki_sample
from gateway.server.services import build_reranker
from gateway.settings import Settings

# The graph runs the fp32 encoder the training forward ran with the shipped fp16 weights cast
# back to fp32; the differences are float32 summation order.
REFERENCE_TOLERANCE = 2e-3
SHIPPED_LIMIT_BYTES = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rerank") / "rerank.onnx"
    assert main(["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def reranker(graph: Path) -> LocalCrossEncoder:
    return LocalCrossEncoder(graph_path=graph)


@pytest.fixture(scope="module")
def leads() -> dict[str, str]:
    wanted = ("Eiffel Tower", "Photosynthesis", "Alfred Nobel", "Galileo Galilei", "Mount Everest")
    return {d.title: d.text[:1200] for d in load_wiki_sample() if d.title in wanted}


def test_the_shipped_delta_is_small_and_names_wheel_tensors() -> None:
    assert DELTA_PATH.stat().st_size < SHIPPED_LIMIT_BYTES
    delta = load_delta()
    assert delta.head.weight.shape == (1, 384)
    assert delta.head.replaced
    assert all(name.startswith("encoder.layer.") for name in delta.head.replaced)


def test_the_graph_gives_the_training_forwards_scores(reranker: LocalCrossEncoder) -> None:
    reference = load_delta().reference
    assert reference
    for pair in reference:
        scores = reranker.scores_sync(pair["query"], pair["passages"])
        assert scores == pytest.approx(pair["scores"], abs=REFERENCE_TOLERANCE)


def test_the_cached_graph_file_is_used(reranker: LocalCrossEncoder) -> None:
    assert reranker.graph_source == "file"
    assert reranker.model_id == f"minilm-rerank-{load_delta().head.digest[:12]}"


def test_a_graph_of_other_weights_is_rebuilt_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = tmp_path / "stale.onnx"
    from backends.embeddings.onnx_graph import write_graph

    write_graph(default_model_path(), stale)  # the embedder's graph: other metadata
    with caplog.at_level(logging.WARNING):
        rebuilt = LocalCrossEncoder(graph_path=stale)
    assert rebuilt.graph_source == "memory"
    assert "built from other weights" in caplog.text
    pair = load_delta().reference[0]
    assert rebuilt.scores_sync(pair["query"], pair["passages"]) == pytest.approx(
        pair["scores"], abs=REFERENCE_TOLERANCE
    )


@pytest.mark.parametrize(
    ("query", "page"),
    [
        ("When was the Eiffel Tower built?", "Eiffel Tower"),
        ("How do plants turn light into chemical energy?", "Photosynthesis"),
        ("inventor of dynamite", "Alfred Nobel"),
        ("What is the highest mountain above sea level?", "Mount Everest"),
    ],
)
def test_the_relevant_lead_scores_highest(
    reranker: LocalCrossEncoder, leads: dict[str, str], query: str, page: str
) -> None:
    titles = sorted(leads)
    scores = reranker.scores_sync(query, [leads[t] for t in titles])
    assert titles[scores.index(max(scores))] == page


async def test_scores_are_one_per_passage_in_order(
    reranker: LocalCrossEncoder, leads: dict[str, str]
) -> None:
    passages = [leads["Galileo Galilei"], leads["Eiffel Tower"], leads["Galileo Galilei"]]
    request = RerankRequest("acme", "Italian astronomer who championed heliocentrism", passages)
    scores = await reranker.scores(request)
    assert len(scores) == 3
    assert scores[0] == pytest.approx(scores[2], abs=1e-5)
    assert scores[0] > scores[1]
    assert scores == pytest.approx(reranker.scores_sync(request.query, passages), abs=1e-5)


async def test_empty_passages_do_no_work(reranker: LocalCrossEncoder) -> None:
    past = time.monotonic() - 1  # would refuse any work at all
    assert await reranker.scores(RerankRequest("acme", "anything", [], deadline=past)) == []


async def test_a_deadline_already_past_starts_no_work(reranker: LocalCrossEncoder) -> None:
    request = RerankRequest("acme", "q", ["a passage"], deadline=time.monotonic() - 1)
    with pytest.raises(BackendUnavailable):
        await reranker.scores(request)


def test_no_batch_starts_past_the_deadline(
    graph: Path, leads: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One pair per batch; the clock passes the deadline once the first batch has run.
    small = LocalCrossEncoder(graph_path=graph, batch_tokens=1)
    runs: list[int] = []
    session = small._session

    class Counting:
        def run(self, names: Any, feeds: Any) -> Any:
            runs.append(len(feeds["input_ids"]))
            return session.run(names, feeds)

    small._session = Counting()
    clock = iter([0.0, 10.0, 20.0])
    monkeypatch.setattr("backends.rerank.local.time.monotonic", lambda: next(clock))
    with pytest.raises(BackendUnavailable):
        small.scores_sync("q", list(leads.values()), deadline=5.0)
    assert runs == [1]


@pytest.mark.parametrize("rerank", [{"reranker": "local"}, {}], ids=["named", "the-default"])
async def test_the_config_names_the_local_reranker(rerank: dict[str, str]) -> None:
    reranker = build_reranker(Settings(retrieval={"rerank": rerank}))
    assert isinstance(reranker, LocalCrossEncoder)
    try:
        assert reranker.kind == "local"
        scores = await reranker.scores(
            RerankRequest("acme", "When was the Eiffel Tower built?", ["a", "b"])
        )
        assert len(scores) == 2
    finally:
        await reranker.aclose()
