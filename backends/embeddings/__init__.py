"""Embedding backends: MiniLM in-process (numpy, offline) and remote models through litellm."""

from backends.embeddings.base import Embedder

__all__ = ["Embedder"]
