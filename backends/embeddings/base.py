"""Embeddings seam: text -> L2-normalised float32 vectors.

The gateway embeds a query once per request and hands the vector to every stage that needs it
(cache, classifier, retrieval). `model_id` goes into cache keys, so vectors from different
models never meet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from backends.retrieval.base import Vector


class Embedder(Protocol):
    model_id: str
    dimension: int

    async def embed(self, texts: Sequence[str]) -> Vector:
        """A (len(texts), dimension) float32 array, each row L2-normalised."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TokenWindow:
    """An encoder's input limit, for chunking: text past `max_tokens` is cut off unseen.

    `max_tokens` counts the special tokens the encoder adds (`special_tokens`: [CLS] and [SEP]
    for BERT); `count` is a text's tokens without them, by the encoder's own tokenizer.
    """

    max_tokens: int
    special_tokens: int
    count: Callable[[str], int]
    # How many of a text's tokens the tokenizer did not know ([UNK]): the vector of such a
    # text says little about it (Thai, Amharic or emoji-only text embed almost alike), so
    # the response cache compares it exactly only. None: not known.
    unknown: Callable[[str], int] | None = None

    @property
    def text_tokens(self) -> int:
        """How many tokens of text one input can hold."""
        return self.max_tokens - self.special_tokens


def token_window(embedder: object) -> TokenWindow | None:
    """The embedder's window, when it has one it knows (a remote API's is not known here)."""
    window = getattr(embedder, "token_window", None)
    return window if isinstance(window, TokenWindow) else None
