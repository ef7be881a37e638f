"""A document past `server.max_document_chunks` is refused for the price of the chunks up to
the cap, not of chunking it whole; the chunks of every other document are what they were."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from backends.embeddings.base import TokenWindow
from backends.embeddings.minilm import MiniLMEmbedder
from backends.retrieval.base import Vector
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.ingest.chunker import ChunkingConfig, TextChunk, chunk_document, iter_chunks
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import RawDocument
from gateway.ingest.wiki_sample import load_wiki_sample
from tests.unit.test_chunk_window import long_document


class CountingEmbedder:
    """The real tokenizer's window, counting the characters it is given; embeds nothing."""

    model_id = "counting"
    dimension = 8

    def __init__(self, real: TokenWindow) -> None:
        self.tokenized = 0
        self.embedded = 0

        def count(text: str) -> int:
            self.tokenized += len(text)
            return real.count(text)

        self.token_window = TokenWindow(real.max_tokens, real.special_tokens, count)

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.embedded += len(texts)
        return np.zeros((len(texts), self.dimension), dtype=np.float32)

    async def aclose(self) -> None:
        return None


async def test_a_document_past_the_cap_is_refused_after_the_chunks_up_to_it(
    minilm: MiniLMEmbedder, tmp_path: Path
) -> None:
    """Space-separated "a-b" words: fewer tokens than the cap's windows hold (so the one-pass
    token bound lets it through), more chunks than the cap once chunks overlap. Chunking it
    whole put ~150 times the text through the tokenizer (500,000 characters: 13 CPU-seconds
    for a 413); now the chunker stops at the first chunk past the cap, each chunk costing a
    few counts of itself."""
    max_chunks = 100
    text = "a-b " * 8_000  # 24,000 tokens, under 100 windows (25,600); 108 chunks
    assert minilm.token_window.count(text) < max_chunks * minilm.token_window.max_tokens
    embedder = CountingEmbedder(minilm.token_window)
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        report = await ingest_documents(
            "t", [RawDocument("dense", "Dense", text)], embedder, index, max_chunks=max_chunks
        )
    assert report.too_large_ids == ["dense"]
    assert embedder.embedded == 0
    ratio = embedder.tokenized / len(text)
    assert ratio < 12, f"{ratio:.0f} times the text through the tokenizer"


def test_chunks_are_made_only_when_asked_for(minilm: MiniLMEmbedder) -> None:
    """What the pipeline's refusal stands on: taking the first chunks of a long document
    tokenizes about the sections they come from, not the whole text."""
    text = "\n\n".join(f"# Part {i}\n\n" + "a-b " * 2_000 for i in range(50))
    embedder = CountingEmbedder(minilm.token_window)
    first = list(islice(iter_chunks("d", "D", text, window=embedder.token_window), 3))
    assert [c.section for c in first] == ["Part 0"] * 3
    assert embedder.tokenized < len(text) / 5, embedder.tokenized


def _digest(chunks: Iterable[TextChunk]) -> tuple[int, str]:
    digest, n = hashlib.sha256(), 0
    for c in chunks:
        n += 1
        digest.update(f"{c.chunk_id}\x00{c.text}\x00{c.section}\x00{c.context}\x01".encode())
    return n, digest.hexdigest()


# The chunks, byte for byte, that a chunker counting every candidate chunk makes: the chunker
# that stops counting at the cap must make the same ones.
SAMPLE_WINDOW = (10092, "3ea91e648da3aa9cea85a3d58df54b9706e9166e4215a6576bb3d78f16790050")
SAMPLE_APPROX = (10037, "bd74b19ea6a8bf4e16786f5b14a21163437b3836e9bd1c8cf6bd6cc7f7b1dc08")
SAMPLE_SMALL = (1068, "68439ea48a36678773a3ffdee9872d4bc92c042817125d43e46b480e37ad8aa4")
SYNTHETIC_WINDOW = (285, "9357104a9ed99e46413fdb135f72a9ea8ff25fb7e9d68973017e2fe02634b487")
SYNTHETIC_LEN = (2911, "29b2775386c954c82b1a93712f093d9d82cbc7e45b27b5f845667c9ad9287c94")


def synthetic() -> list[str]:
    """Word-level splits, sentences, paragraphs, long words cut into glued pieces, CJK."""
    return [
        long_document(),
        "a-b " * 8000,
        "ab. " * 8000,
        "x" * 3000 + " y" * 500,
        "漢字" * 3000,
        "word\n" * 4000,
        "# T\n\n" + ("Hi there. " * 50 + "\n\n") * 40,
    ]


def test_the_sample_corpus_is_chunked_as_before(minilm: MiniLMEmbedder) -> None:
    docs = load_wiki_sample()
    window = minilm.token_window
    chunks = (c for d in docs for c in chunk_document(d.doc_id, d.title, d.text, window=window))
    assert _digest(chunks) == SAMPLE_WINDOW
    assert _digest(c for d in docs for c in chunk_document(d.doc_id, d.title, d.text)) == (
        SAMPLE_APPROX
    )
    small = ChunkingConfig(target_tokens=40, overlap=0.2)
    chunks = (c for d in docs[:300] for c in chunk_document(d.doc_id, d.title, d.text, small))
    assert _digest(chunks) == SAMPLE_SMALL


@pytest.mark.parametrize(
    ("window", "expected"),
    [(None, SYNTHETIC_WINDOW), (TokenWindow(60, 2, len), SYNTHETIC_LEN)],
    ids=["minilm", "one-token-per-character"],
)
def test_dense_and_odd_texts_are_chunked_as_before(
    minilm: MiniLMEmbedder, window: TokenWindow | None, expected: tuple[int, str]
) -> None:
    title = "T" if window is not None else "Synthetic title"
    window = window or minilm.token_window
    made = (
        c
        for i, text in enumerate(synthetic())
        for c in chunk_document(f"s{i}", title, text, window=window)
    )
    assert _digest(made) == expected
