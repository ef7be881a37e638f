"""Chunking: sections, sizes, overlap, stable ids and the context that gets embedded."""

from __future__ import annotations

import itertools

from gateway.ingest.chunker import (
    ChunkingConfig,
    approx_tokens,
    chunk_document,
    sections,
)

SMALL = ChunkingConfig(target_tokens=60, overlap=0.12)


def prose(paragraphs: int, sentences: int) -> str:
    return "\n\n".join(
        " ".join(f"Paragraph {p} sentence {s} says a little more." for s in range(sentences))
        for p in range(paragraphs)
    )


def test_short_document_is_one_chunk_with_the_title_as_context() -> None:
    (chunk,) = chunk_document("notes.txt", "Notes", "Just one line.")
    assert (chunk.chunk_id, chunk.text, chunk.section) == ("notes.txt#0", "Just one line.", "")
    assert chunk.embedding_text == "Notes\n\nJust one line."


def test_each_chunk_carries_its_heading_path() -> None:
    text = (
        "# Guide\n\nIntro.\n\n## Install\n\nRun it.\n\n### Linux\n\nUse apt.\n\n## Use\n\nCall it."
    )
    chunks = chunk_document("g.md", "Guide", text)
    assert [(c.section, c.text) for c in chunks] == [
        ("", "Intro."),
        ("Install", "Run it."),
        ("Install > Linux", "Use apt."),
        ("Use", "Call it."),
    ]
    assert chunks[2].context == "Guide — Install > Linux"
    assert chunks[2].embedding_text.startswith("Guide — Install > Linux\n\n")


def test_hash_inside_a_code_block_is_not_a_heading() -> None:
    text = "## Setup\n\n```sh\n# not a heading\nmake\n```\n"
    assert [path for path, _ in sections(text, "T")] == [("Setup",)]


def test_no_chunk_exceeds_the_target() -> None:
    chunks = chunk_document("d", "D", prose(6, 12), SMALL)
    assert len(chunks) > 6
    assert all(approx_tokens(c.text) <= SMALL.target_tokens for c in chunks)


def test_consecutive_chunks_overlap_by_whole_sentences() -> None:
    chunks = chunk_document("d", "D", prose(1, 30), SMALL)
    for before, after in itertools.pairwise(chunks):
        first_sentence = after.text.split(". ")[0] + "."
        assert first_sentence in before.text


def test_paragraphs_are_kept_whole_when_they_fit() -> None:
    text = prose(4, 2)
    chunks = chunk_document("d", "D", text, ChunkingConfig(target_tokens=40, overlap=0.0))
    paragraphs = text.split("\n\n")
    assert all(any(p in c.text for c in chunks) for p in paragraphs)


def test_a_sentence_longer_than_the_target_is_split_at_words() -> None:
    long_sentence = " ".join(f"word{i}" for i in range(200))
    chunks = chunk_document("d", "D", long_sentence, SMALL)
    assert len(chunks) >= 3
    assert all(approx_tokens(c.text) <= SMALL.target_tokens for c in chunks)


def test_chunk_ids_are_stable_and_sequential() -> None:
    text = prose(5, 10)
    first = chunk_document("doc", "Doc", text, SMALL)
    second = chunk_document("doc", "Doc", text, SMALL)
    assert [c.chunk_id for c in first] == [f"doc#{i}" for i in range(len(first))]
    assert first == second


def test_every_word_of_the_document_is_in_some_chunk() -> None:
    text = "# T\n\n" + prose(3, 15)
    chunks = chunk_document("d", "T", text, SMALL)
    covered = set(" ".join(c.text for c in chunks).split())
    assert set(prose(3, 15).split()) <= covered


def test_approximate_tokens_track_word_pieces() -> None:
    assert approx_tokens("") == 0
    assert 10 <= approx_tokens("The quick brown fox jumps over the lazy dog, twice.") <= 14
