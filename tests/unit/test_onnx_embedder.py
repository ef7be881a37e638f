"""The onnxruntime MiniLM gives the numpy pass's vectors (to 1e-4) and says which runtime runs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.embeddings.config import EmbeddingsConfig, build_embedder
from backends.embeddings.minilm import MiniLMEmbedder, default_model_path
from backends.embeddings.onnx_graph import GRAPH_VERSION, weights_digest, write_graph
from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder

PARITY = 1e-4

VARIED = [
    "a",
    "Who designed the Eiffel Tower?",
    "ERR-4471 means the upstream certificate expired; SKU_123-b",
    "Zürich, São Paulo, 北京, Москва — naïve café façade ☕",
    "   leading and trailing spaces   ",
    "\n\nline\nbreaks\tand\ttabs\n",
    "https://example.com/a/very/long/url?with=query&and=more#fragment",
    "The quick brown fox jumps over the lazy dog. " * 3,
    # past the 256-token window: truncated alike by both
    "Long documents must be truncated at the window, not rejected. " * 60,
    "tokenization " * 1000,
    " ".join(f"w{i}" for i in range(700)),
]


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_graph(default_model_path(), tmp_path_factory.mktemp("onnx") / "minilm.onnx")


@pytest.fixture(scope="module")
def runtimes(graph: Path) -> Iterator[tuple[MiniLMEmbedder, OnnxMiniLMEmbedder]]:
    numpy_embedder = MiniLMEmbedder()
    onnx_embedder = OnnxMiniLMEmbedder(graph_path=graph)
    yield numpy_embedder, onnx_embedder


def test_the_graph_file_names_the_weights_it_was_built_from(graph: Path) -> None:
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
    assert meta == {
        "graph_version": GRAPH_VERSION,
        "weights_sha256": weights_digest(default_model_path()),
    }


def test_the_cached_graph_file_is_used(
    runtimes: tuple[MiniLMEmbedder, OnnxMiniLMEmbedder],
) -> None:
    assert runtimes[1].graph_source == "file"


def test_varied_inputs_one_at_a_time_match_numpy(
    runtimes: tuple[MiniLMEmbedder, OnnxMiniLMEmbedder],
) -> None:
    numpy_embedder, onnx_embedder = runtimes
    for text in VARIED:
        expected = numpy_embedder.embed_sync([text])
        np.testing.assert_allclose(onnx_embedder.embed_sync([text]), expected, atol=PARITY)


def test_padded_batches_match_numpy_and_single_calls(
    runtimes: tuple[MiniLMEmbedder, OnnxMiniLMEmbedder],
) -> None:
    numpy_embedder, onnx_embedder = runtimes
    # Short and long texts in one call: the short ones are padded to the long ones' width.
    batch = VARIED + [t.upper() for t in VARIED]
    onnx_batch = onnx_embedder.embed_sync(batch)
    np.testing.assert_allclose(onnx_batch, numpy_embedder.embed_sync(batch), atol=PARITY)
    singles = np.vstack([onnx_embedder.embed_sync([t]) for t in batch])
    np.testing.assert_allclose(onnx_batch, singles, atol=PARITY)


def test_long_inputs_are_truncated_at_256_tokens_by_both(
    runtimes: tuple[MiniLMEmbedder, OnnxMiniLMEmbedder],
) -> None:
    numpy_embedder, onnx_embedder = runtimes
    window = onnx_embedder.token_window
    assert window.max_tokens == 256
    long_text = "tokenization " * 1000
    assert window.count(long_text) > 256
    cut = onnx_embedder.embed_sync([long_text, "tokenization " * 300])
    np.testing.assert_allclose(cut[0], cut[1], atol=1e-5)
    np.testing.assert_allclose(cut, numpy_embedder.embed_sync([long_text] * 2), atol=PARITY)


def test_vectors_are_float32_unit_rows(
    runtimes: tuple[MiniLMEmbedder, OnnxMiniLMEmbedder],
) -> None:
    vectors = runtimes[1].embed_sync(VARIED)
    assert vectors.shape == (len(VARIED), 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


async def test_async_embed_and_empty_input(
    runtimes: tuple[MiniLMEmbedder, OnnxMiniLMEmbedder],
) -> None:
    onnx_embedder = runtimes[1]
    assert (await onnx_embedder.embed([])).shape == (0, 384)
    vector = await onnx_embedder.embed(["Who designed the Eiffel Tower?"])
    np.testing.assert_allclose(vector, onnx_embedder.embed_sync([VARIED[1]]), atol=1e-6)


def test_a_missing_graph_file_is_built_in_memory_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        embedder = OnnxMiniLMEmbedder(graph_path=tmp_path / "absent.onnx")
    assert embedder.graph_source == "memory"
    assert "onnx graph not cached" in caplog.text
    np.testing.assert_allclose(
        embedder.embed_sync(VARIED[:3]), MiniLMEmbedder().embed_sync(VARIED[:3]), atol=PARITY
    )


def test_auto_uses_onnx_and_logs_the_runtime(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="backends.embeddings.config"):
        embedder = build_embedder(EmbeddingsConfig())
    assert isinstance(embedder, OnnxMiniLMEmbedder)
    (record,) = [r for r in caplog.records if r.getMessage() == "embedding runtime"]
    assert record.__dict__["runtime"] == "onnx"


def test_without_onnxruntime_auto_falls_back_to_numpy_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    monkeypatch.delitem(sys.modules, "backends.embeddings.onnx_minilm", raising=False)
    with caplog.at_level(logging.INFO, logger="backends.embeddings.config"):
        embedder = build_embedder(EmbeddingsConfig())
    assert type(embedder) is MiniLMEmbedder
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "onnxruntime is not installed" in warning[0].getMessage()
    (record,) = [r for r in caplog.records if r.getMessage() == "embedding runtime"]
    assert record.__dict__["runtime"] == "numpy"


def test_runtime_onnx_without_onnxruntime_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.delitem(sys.modules, "backends.embeddings.onnx_minilm", raising=False)
    with pytest.raises(ValueError, match="onnxruntime"):
        build_embedder(EmbeddingsConfig(runtime="onnx"))


def test_runtime_numpy_is_numpy() -> None:
    assert type(build_embedder(EmbeddingsConfig(runtime="numpy"))) is MiniLMEmbedder


def test_threads_set_the_forward_pass_s_intra_op_threads_and_keep_the_vectors() -> None:
    one = build_embedder(EmbeddingsConfig(runtime="onnx"))
    two = build_embedder(EmbeddingsConfig(runtime="onnx", threads=2))
    assert isinstance(one, OnnxMiniLMEmbedder) and isinstance(two, OnnxMiniLMEmbedder)
    assert one._session.get_session_options().intra_op_num_threads == 1
    assert two._session.get_session_options().intra_op_num_threads == 2
    np.testing.assert_allclose(two.embed_sync(VARIED[:4]), one.embed_sync(VARIED[:4]), atol=PARITY)
