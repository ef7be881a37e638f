"""`embeddings.precision: int8`: a quantised graph, rebuilt byte for byte, never taken for the
fp32 one, whose vectors stay close to fp32's without being them."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from backends.embeddings.config import EmbeddingsConfig, build_embedder
from backends.embeddings.int8_graph import build_int8_model, int8_metadata
from backends.embeddings.minilm import default_model_path
from backends.embeddings.onnx_graph import save_model, write_graph
from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder
from tests.unit.test_onnx_embedder import VARIED


@pytest.fixture(scope="module")
def int8_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(
        build_int8_model(default_model_path()), tmp_path_factory.mktemp("int8") / "int8.onnx"
    )


@pytest.fixture(scope="module")
def fp32_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_graph(default_model_path(), tmp_path_factory.mktemp("fp32") / "fp32.onnx")


def test_the_int8_graph_is_rebuilt_byte_for_byte(int8_graph: Path, tmp_path: Path) -> None:
    again = save_model(build_int8_model(default_model_path()), tmp_path / "again.onnx")
    assert again.read_bytes() == int8_graph.read_bytes()


def test_the_int8_graph_names_its_weights_and_its_precision(int8_graph: Path) -> None:
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(int8_graph)).metadata_props}
    assert meta == int8_metadata(default_model_path())
    assert meta["precision"] == "int8"
    quantised = {n.op_type for n in onnx.load(str(int8_graph)).graph.node}
    assert "MatMulInteger" in quantised or "DynamicQuantizeMatMul" in quantised


def test_int8_vectors_are_close_to_fp32_and_not_fp32(int8_graph: Path, fp32_graph: Path) -> None:
    int8 = OnnxMiniLMEmbedder(precision="int8", graph_path=int8_graph)
    fp32 = OnnxMiniLMEmbedder(graph_path=fp32_graph)
    assert int8.graph_source == "file" and int8.runtime == "onnx-int8"
    a, b = fp32.embed_sync(VARIED), int8.embed_sync(VARIED)
    assert b.shape == a.shape and b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cosine = (a * b).sum(axis=1)
    assert cosine.min() > 0.98, cosine
    assert np.abs(a - b).max() > 1e-3  # quantised: not the fp32 pass under another name


def test_an_fp32_graph_is_never_loaded_as_the_int8_one(
    fp32_graph: Path, int8_graph: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        embedder = OnnxMiniLMEmbedder(precision="int8", graph_path=fp32_graph)
    assert embedder.graph_source == "memory"
    assert "python -m backends.embeddings.int8_graph" in caplog.text
    cached = OnnxMiniLMEmbedder(precision="int8", graph_path=int8_graph)
    np.testing.assert_allclose(embedder.embed_sync(VARIED), cached.embed_sync(VARIED), atol=1e-6)
    with caplog.at_level(logging.WARNING):
        fp32 = OnnxMiniLMEmbedder(graph_path=int8_graph)
    assert fp32.graph_source == "memory"


def test_precision_int8_is_built_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="backends.embeddings.config"):
        embedder = build_embedder(EmbeddingsConfig(precision="int8"))
    assert isinstance(embedder, OnnxMiniLMEmbedder) and embedder.precision == "int8"
    (record,) = [r for r in caplog.records if r.getMessage() == "embedding runtime"]
    assert record.__dict__["runtime"] == "onnx-int8"
    assert embedder.model_id == build_embedder(EmbeddingsConfig()).model_id


@pytest.mark.parametrize(
    "section",
    [
        {"precision": "int8", "runtime": "numpy"},
        {"precision": "int8", "backend": "litellm", "model": "openai/x", "dimension": 8},
        {"precision": "int4"},
    ],
)
def test_a_precision_the_runtime_cannot_run_is_refused(section: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="precision"):
        EmbeddingsConfig.model_validate(section)
