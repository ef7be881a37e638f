"""The chunker's size and the embedder's window, tested together: every chunk's embedded text
(context line, separator, chunk, [CLS] and [SEP]) fits the window the embedder truncates at, so
no chunk is silently cut."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from backends.embeddings.base import TokenWindow
from backends.embeddings.minilm import MiniLMEmbedder, default_model_path, load_tokenizer
from gateway.ingest.chunker import ChunkingConfig, approx_tokens, chunk_document
from gateway.ingest.wiki_sample import load_wiki_sample
from gateway.settings import ServerConfig


@pytest.fixture
def embedder(minilm: MiniLMEmbedder) -> MiniLMEmbedder:
    return minilm


@pytest.fixture(scope="module")
def whole() -> Tokenizer:
    """The model's tokenizer without truncation: how long an input really is."""
    return load_tokenizer(default_model_path(), None)


def fits_uncut(embedder: MiniLMEmbedder, whole: Tokenizer, text: str) -> bool:
    """The embedder sees all of `text`: its real length, specials included, is within the
    window, and the embedder's own (truncating) encoding of it is that long."""
    real = len(whole.encode(text).ids)
    seen = len(embedder.encode([text])[0])
    return real == seen <= embedder.token_window.max_tokens


def long_document() -> str:
    paragraph = " ".join(
        f"Sentence {i} of the paragraph mentions Zürich, ERR-{4400 + i} and "
        "hyperparameterisation, which splits into many word pieces."
        for i in range(9)
    )
    sections = [f"## Section {s}\n\n" + "\n\n".join([paragraph] * 4) for s in range(3)]
    giant_word = "x" * 3000  # no separator splits it
    url = "https://example.com/" + "/".join(f"segment{i}" for i in range(400))
    return "# Manual\n\n" + "\n\n".join(sections) + f"\n\n## Blobs\n\n{giant_word} {url}\n"


def test_every_chunk_of_a_long_document_fits_the_window_uncut(
    embedder: MiniLMEmbedder, whole: Tokenizer
) -> None:
    chunks = chunk_document("manual.md", "Manual", long_document(), window=embedder.token_window)
    assert len(chunks) > 10
    for chunk in chunks:
        assert fits_uncut(embedder, whole, chunk.embedding_text), chunk.chunk_id
    # Nothing is lost: every word of the document is in some chunk.
    text = " ".join(c.text for c in chunks)
    assert "x" * 3000 in text.replace(" ", "") and "segment399" in text.replace(" ", "")


def test_chunks_fill_the_window_rather_than_stay_tiny(
    embedder: MiniLMEmbedder, whole: Tokenizer
) -> None:
    chunks = chunk_document("manual.md", "Manual", long_document(), window=embedder.token_window)
    sizes = [len(whole.encode(c.embedding_text).ids) for c in chunks]
    assert max(sizes) <= 256
    assert sorted(sizes)[len(sizes) // 2] > 150  # the median chunk uses most of the window


def test_a_long_title_and_heading_path_still_leave_room(
    embedder: MiniLMEmbedder, whole: Tokenizer
) -> None:
    title = "A very long title " * 40
    text = "# Heading\n\n## " + "Deep heading words " * 30 + "\n\n" + "Some body text. " * 200
    chunks = chunk_document("t", title, text, window=embedder.token_window)
    assert chunks
    for chunk in chunks:
        assert fits_uncut(embedder, whole, chunk.embedding_text)


def test_the_old_word_estimate_overflowed_the_window(
    embedder: MiniLMEmbedder, whole: Tokenizer
) -> None:
    """Why the window: sized by the word estimate at the 350 default, chunks run past 256."""
    chunks = chunk_document("manual.md", "Manual", long_document(), count=approx_tokens)
    assert max(len(whole.encode(c.embedding_text).ids) for c in chunks) > 256


def test_a_smaller_target_than_the_window_still_applies(embedder: MiniLMEmbedder) -> None:
    config = ChunkingConfig(target_tokens=60)
    window = embedder.token_window
    chunks = chunk_document("m", "Manual", long_document(), config, window=window)
    assert all(window.count(c.text) <= 60 for c in chunks)


def test_window_counts_with_a_custom_tokenizer() -> None:
    """Any tokenizer: here one character is one token, and [CLS]/[SEP] count two."""
    window = TokenWindow(max_tokens=40, special_tokens=2, count=len)
    chunks = chunk_document("d", "T", "word " * 100, window=window)
    assert all(len(c.embedding_text) + 2 <= 40 for c in chunks)


def test_sample_corpus_chunks_fit_the_window(embedder: MiniLMEmbedder, whole: Tokenizer) -> None:
    docs = load_wiki_sample()
    longest = sorted(docs, key=lambda d: len(d.text))[-40:]  # where overflow would happen
    for doc in longest:
        for chunk in chunk_document(doc.doc_id, doc.title, doc.text, window=embedder.token_window):
            assert fits_uncut(embedder, whole, chunk.embedding_text), chunk.chunk_id


def test_window_is_the_embedders_truncation(embedder: MiniLMEmbedder) -> None:
    assert len(embedder.encode(["word " * 1000])[0]) == embedder.token_window.max_tokens


def test_a_long_word_is_cut_in_linear_time(embedder: MiniLMEmbedder) -> None:
    """A word no separator splits ("a-a-a-...", 2 tokens per 2 characters) is cut piece by piece
    from a prefix found by doubling: tokenizing the whole rest for each piece was quadratic
    (60,000 characters: 6.7 CPU-seconds and ~240 times the text through the tokenizer)."""
    window = embedder.token_window
    tokenized = 0

    def counting(text: str) -> int:
        nonlocal tokenized
        tokenized += len(text)
        return window.count(text)

    text = "a-" * 30_000
    counted = TokenWindow(window.max_tokens, window.special_tokens, counting)
    chunks = chunk_document("dense", "Dense", text, window=counted)
    assert len(chunks) > 200
    assert all(window.count(c.embedding_text) <= window.text_tokens for c in chunks)
    assert tokenized < 30 * len(text), f"{tokenized / len(text):.0f} times the text tokenized"


def test_the_default_chunk_cap_admits_a_mebibyte_of_prose(embedder: MiniLMEmbedder) -> None:
    """server.max_document_chunks's default: 1 MiB of the sample's English prose makes 1,253
    chunks (under 1,500); 500,000 characters of "a-a-..." would make 1,985."""
    prose = "\n\n".join(doc.text for doc in load_wiki_sample()).encode()[: 1 << 20]
    text = prose.decode(errors="ignore")
    chunks = chunk_document("prose", "Prose", text, window=embedder.token_window)
    assert len(chunks) <= ServerConfig().max_document_chunks
    assert len(chunks) > 0.8 * ServerConfig().max_document_chunks  # not far above it either
