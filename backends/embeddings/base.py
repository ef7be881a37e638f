"""Embeddings seam: text -> L2-normalised float32 vectors.

The gateway embeds a query once per request and hands the vector to every stage that needs it
(cache, classifier, retrieval). `model_id` goes into cache keys, so vectors from different
models never meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from backends.retrieval.base import Vector


class Embedder(Protocol):
    model_id: str
    dimension: int

    async def embed(self, texts: Sequence[str]) -> Vector:
        """A (len(texts), dimension) float32 array, each row L2-normalised."""
        ...

    async def aclose(self) -> None: ...
