"""Hybrid retrieval backends: `embedded` (SQLite FTS5 + numpy, no server) and `opensearch`."""

from backends.retrieval.base import Chunk, Document, Hit, RetrievalMode, Retriever

__all__ = ["Chunk", "Document", "Hit", "RetrievalMode", "Retriever"]
