"""How a (query, passage) pair becomes the cross-encoder's input: shared by training and serving.

`[CLS] query [SEP] passage [SEP]`, the query cut at `QUERY_TOKENS` word pieces and the passage
at `cut`; token type 0 up to the first [SEP], 1 after it (BERT's sentence-pair segments). Only
the tokenizer is needed, so scripts/train_reranker.py (torch, no onnxruntime) and
`LocalCrossEncoder` (onnxruntime, no torch) encode identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

QUERY_TOKENS = 32  # FanOutQA sub-questions and search-box queries fit in it

I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class PairBatch:
    """One padded batch: ids, token types and mask, each (batch, length)."""

    input_ids: I64
    token_type_ids: I64
    attention_mask: F32


class PairEncoder:
    def __init__(self, tokenizer: Tokenizer, cut: int) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self.cut = cut
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        if cls is None or sep is None:
            raise ValueError("the tokenizer has no [CLS] or [SEP] token")
        self._cls, self._sep = cls, sep

    def pieces(self, texts: Sequence[str], limit: int) -> list[list[int]]:
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids[:limit] for e in encoded]

    def pair_ids(self, query: str, passages: Sequence[str]) -> list[tuple[list[int], int]]:
        """Per passage: the pair's ids and where its second segment starts."""
        (q,) = self.pieces([query], QUERY_TOKENS)
        head = [self._cls, *q, self._sep]
        return [(head + p + [self._sep], len(head)) for p in self.pieces(passages, self.cut)]

    def batch(self, pairs: Sequence[tuple[list[int], int]]) -> PairBatch:
        length = max(len(ids) for ids, _ in pairs)
        ids = np.zeros((len(pairs), length), dtype=np.int64)
        types = np.zeros((len(pairs), length), dtype=np.int64)
        mask = np.zeros((len(pairs), length), dtype=np.float32)
        for row, (seq, second) in enumerate(pairs):
            ids[row, : len(seq)] = seq
            types[row, second : len(seq)] = 1
            mask[row, : len(seq)] = 1.0
        return PairBatch(ids, types, mask)
