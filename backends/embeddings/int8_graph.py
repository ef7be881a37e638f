"""The int8 ONNX graph of all-MiniLM-L6-v2: the fp32 graph with its MatMuls quantised.

    python -m backends.embeddings.int8_graph            # writes default_int8_graph_path()
    python -m backends.embeddings.int8_graph --out X    # somewhere else

onnxruntime's dynamic quantisation of `backends.embeddings.onnx_graph`'s graph: every MatMul's
weights to int8 per output channel, its activations quantised per call. Per channel, because
per tensor drifted to cosine 0.957 from the fp32 vectors where per channel keeps 0.995
(docs/benchmarks.md, "The int8 encoder"). `embeddings.precision: int8` loads it; its figures
against fp32 on every routing and retrieval benchmark are `bench/int8_encoder_eval.py`'s.

The file carries the fp32 graph's metadata plus `precision: int8`, so neither graph is ever
taken for the other. `scripts/setup.sh` runs this after the fp32 graph; without the file the
embedder builds the same graph in memory at start (a few seconds).
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from backends.embeddings.onnx_graph import build_model, expected_metadata, graph_command

INT8_GRAPH_FILE = "all-MiniLM-L6-v2.int8.onnx"


def default_int8_graph_path() -> Path:
    """Beside the fp32 graph, inside the environment."""
    return Path(sys.prefix) / "share" / "querygate" / INT8_GRAPH_FILE


def int8_metadata(model_path: Path) -> dict[str, str]:
    """The metadata of an int8 graph quantised from these weights' fp32 graph."""
    return expected_metadata(model_path) | {"precision": "int8"}


class _NoPreprocessAdvice(logging.Filter):
    """onnxruntime advises shape pre-processing on the root logger at every quantisation; the
    graph is measured as quantised without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Please consider to run pre-processing")


def build_int8_model(model_path: Path) -> Any:
    """The int8 ModelProto (typed Any: onnx ships no type information)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    advice = _NoPreprocessAdvice()
    logging.getLogger().addFilter(advice)
    try:
        with tempfile.TemporaryDirectory(prefix="querygate-int8-") as tmp:
            out = Path(tmp) / INT8_GRAPH_FILE
            quantize_dynamic(
                build_model(model_path), out, per_channel=True, weight_type=QuantType.QInt8
            )
            model = onnx.load(str(out))
    finally:
        logging.getLogger().removeFilter(advice)
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, int8_metadata(model_path))
    return model


def main(argv: list[str] | None = None) -> int:
    from backends.embeddings.minilm import default_model_path
    from backends.embeddings.onnx_graph import save_model

    model_path = default_model_path()
    return graph_command(
        argv,
        description=__doc__.split("\n")[0],
        default_out=default_int8_graph_path(),
        expected=int8_metadata(model_path),
        write=lambda out: save_model(build_int8_model(model_path), out),
        what="int8 onnx graph",
    )


if __name__ == "__main__":
    raise SystemExit(main())
