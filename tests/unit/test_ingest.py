"""Reading, hashing, batching and writing documents into an index."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backends.embeddings.minilm import MiniLMEmbedder
from backends.retrieval.base import SearchRequest, Vector
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.ingest.chunker import ChunkingConfig
from gateway.ingest.pipeline import content_hash, ingest_documents
from gateway.ingest.readers import RawDocument, read_paths
from gateway.ingest.wiki_sample import README_PAGES, load_in_ingest_order, load_wiki_sample

TEST_DATA = Path(__file__).resolve().parents[1] / "data"


class FakeEmbedder:
    """Deterministic unit vectors from a hash of the text; records what it was asked."""

    model_id = "fake"
    dimension = 16

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.calls.append(list(texts))
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).standard_normal(self.dimension)
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dimension)

    async def aclose(self) -> None:
        return None


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[EmbeddedRetriever]:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as retriever:
        yield retriever


def docs(n: int, version: str = "v1") -> list[RawDocument]:
    return [RawDocument(f"d{i}", f"Doc {i}", f"Text of document {i}, {version}.") for i in range(n)]


# -- readers ----------------------------------------------------------------------------------


def test_reader_ids_are_paths_relative_to_the_root_and_titles_come_from_headings(
    tmp_path: Path,
) -> None:
    (tmp_path / "guides").mkdir()
    (tmp_path / "guides" / "setup.md").write_text("intro\n\n# Setting Up\n\nSteps.")
    (tmp_path / "plain.txt").write_text("No heading here.")
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    found = {d.doc_id: d.title for d in read_paths([tmp_path])}
    assert found == {"guides/setup.md": "Setting Up", "plain.txt": "plain"}


def test_reader_takes_jsonl_records_with_their_own_ids(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [{"id": "a", "title": "A", "text": "alpha"}, {"id": "b", "text": "beta"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    source = path.resolve().as_posix()  # the file's source, whichever way it was named
    assert list(read_paths([path.parent / ".." / path.parent.name / path.name])) == [
        RawDocument("a", "A", "alpha", source=source),
        RawDocument("b", "b", "beta", source=source),
    ]
    assert {d.source for d in read_paths([path], source="faq")} == {"faq"}


@pytest.mark.parametrize("line", ["not json", '{"id": "a"}', '{"id": 1, "text": "x"}', "[1]"])
def test_reader_names_the_line_of_a_bad_jsonl_record(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        list(read_paths([path]))


def test_reader_takes_a_jsonl_records_access_list(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [
        {"id": "a", "text": "alpha", "groups": ["hr", "finance", "hr"]},
        {"id": "b", "text": "beta", "groups": None},
        {"id": "c", "text": "gamma"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [d.groups for d in read_paths([path])] == [("finance", "hr"), None, None]


@pytest.mark.parametrize(
    ("groups", "why"), [("hr", "must be a list"), ([], "at least one"), (["a\u0000"], "control")]
)
def test_reader_names_the_line_of_a_bad_access_list(
    tmp_path: Path, groups: object, why: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "ok", "text": "x", "groups": groups}) + "\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl:1: groups .*{why}"):
        list(read_paths([path]))


def test_an_access_list_is_part_of_a_documents_version() -> None:
    """A list's change alone writes the document again; no list hashes as before lists."""
    plain = content_hash("T", "text")
    assert plain == hashlib.sha256(b"T\x00text").hexdigest()
    assert content_hash("T", "text", ("hr",)) not in (plain, content_hash("T", "text", ("h", "r")))


def test_reader_refuses_an_unsupported_file(tmp_path: Path) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(b"%PDF")
    with pytest.raises(ValueError, match=r"doc\.pdf"):
        list(read_paths([path]))


def test_wiki_sample_has_every_article_keyed_by_title() -> None:
    sample = load_wiki_sample()
    assert len(sample) == 10_033
    assert all(d.doc_id == d.title and d.text for d in sample)


# -- pipeline ---------------------------------------------------------------------------------


async def test_first_ingest_adds_every_document(index: EmbeddedRetriever) -> None:
    report = await ingest_documents("t", docs(5), FakeEmbedder(), index)
    expected = {
        "added": 5,
        "updated": 0,
        "unchanged": 0,
        "deleted": 0,
        "empty": 0,
        "chunks": 5,
        "too_large": 0,
    }
    assert report.as_dict() == expected
    assert await index.stats("t") == (5, 5)
    assert await index.content_hash("t", "d0") == content_hash("Doc 0", "Text of document 0, v1.")


async def test_unchanged_documents_are_skipped_before_embedding(index: EmbeddedRetriever) -> None:
    await ingest_documents("t", docs(5), FakeEmbedder(), index)
    generation = await index.generation("t")
    embedder = FakeEmbedder()
    changed = docs(5)[:4] + docs(5, "v2")[4:]
    report = await ingest_documents("t", changed, embedder, index)
    assert (report.unchanged, report.updated, report.added) == (4, 1, 0)
    assert embedder.calls == [["Doc 4\n\nText of document 4, v2."]]
    assert await index.generation("t") == generation + 1


async def test_rechunk_rewrites_unchanged_documents_with_today_s_chunker(
    index: EmbeddedRetriever,
) -> None:
    text = " ".join(f"Step {i} is simple." for i in range(60))
    manual = [RawDocument("manual", "Manual", text)]
    old, new = ChunkingConfig(target_tokens=100), ChunkingConfig(target_tokens=40)
    first = await ingest_documents("t", manual, FakeEmbedder(), index, chunking=old)
    generation = await index.generation("t")
    skipped = await ingest_documents("t", manual, FakeEmbedder(), index, chunking=new)
    assert skipped.unchanged == 1 and await index.stats("t") == (1, first.chunks)
    again = await ingest_documents("t", manual, FakeEmbedder(), index, chunking=new, rechunk=True)
    assert (again.updated, again.unchanged, again.added) == (1, 0, 0)
    assert again.chunks > first.chunks
    assert await index.stats("t") == (1, again.chunks)  # the old chunks are gone
    assert await index.content_hash("t", "manual") == content_hash("Manual", text)
    assert await index.generation("t") > generation  # cached answers retire


class WriteDuringEmbed(FakeEmbedder):
    """Runs `write` (a live PUT or DELETE of the same document) while the ingest embeds."""

    def __init__(self, write: Callable[[], Awaitable[object]]) -> None:
        super().__init__()
        self._write: Callable[[], Awaitable[object]] | None = write

    async def embed(self, texts: Sequence[str]) -> Vector:
        if self._write is not None:
            write, self._write = self._write, None
            await write()
        return await super().embed(texts)


@pytest.mark.parametrize("live", ["put", "delete"])
async def test_rechunk_leaves_a_document_written_while_it_ran_as_that_write_left_it(
    index: EmbeddedRetriever, live: str
) -> None:
    """A PUT (or DELETE) that lands between the rechunk's hash lookup and its write is newer
    than the file: the rechunk must not delete it and restore the file's version."""
    manual = [RawDocument("manual", "Manual", "The old manual text.")]
    await ingest_documents("t", manual, FakeEmbedder(), index)
    put = [RawDocument("manual", "Manual", "The manual, edited through the API.")]

    async def write() -> object:
        if live == "put":
            return await ingest_documents("t", put, FakeEmbedder(), index)
        return await index.delete_document("t", "manual")

    report = await ingest_documents("t", manual, WriteDuringEmbed(write), index, rechunk=True)
    expected = content_hash("Manual", put[0].text) if live == "put" else None
    assert await index.content_hash("t", "manual") == expected
    assert (report.updated, report.unchanged) == (0, 1)


async def test_blank_text_deletes_the_document(index: EmbeddedRetriever) -> None:
    await ingest_documents("t", docs(3), FakeEmbedder(), index)
    report = await ingest_documents(
        "t", [RawDocument("d1", "Doc 1", "  \n")], FakeEmbedder(), index
    )
    assert report.deleted == 1
    assert await index.content_hash("t", "d1") is None
    assert await index.stats("t") == (2, 2)


async def test_chunks_of_many_documents_are_embedded_together(index: EmbeddedRetriever) -> None:
    embedder = FakeEmbedder()
    await ingest_documents("t", docs(10), embedder, index, embed_batch=4)
    assert [len(call) for call in embedder.calls] == [4, 4, 2]


async def test_long_documents_are_chunked_with_their_context(index: EmbeddedRetriever) -> None:
    text = "# Manual\n\n## Install\n\n" + " ".join(f"Step {i} is simple." for i in range(60))
    embedder = FakeEmbedder()
    report = await ingest_documents(
        "t",
        [RawDocument("manual.md", "Manual", text)],
        embedder,
        index,
        chunking=ChunkingConfig(target_tokens=50),
    )
    assert report.chunks > 3
    assert all(t.startswith("Manual — Install\n\n") for t in embedder.calls[0])
    assert await index.stats("t") == (1, report.chunks)


async def test_progress_reaches_the_total(index: EmbeddedRetriever) -> None:
    seen: list[tuple[int, int]] = []
    await ingest_documents("t", docs(7), FakeEmbedder(), index, progress=lambda *p: seen.append(p))
    assert seen[-1] == (7, 7)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


async def test_a_repeated_id_keeps_its_last_version(index: EmbeddedRetriever) -> None:
    batch = [RawDocument("d", "D", "first"), RawDocument("d", "D", "second")]
    report = await ingest_documents("t", batch, FakeEmbedder(), index)
    assert report.added == 1
    assert await index.content_hash("t", "d") == content_hash("D", "second")


async def test_minilm_ingest_finds_a_paraphrase_and_an_identifier(
    index: EmbeddedRetriever, minilm: MiniLMEmbedder
) -> None:
    await ingest_documents("acme", read_paths([TEST_DATA / "acme"]), minilm, index)
    query = "the TLS cert on the upstream ran out"
    vector = (await minilm.embed([query]))[0]
    dense = await index.search(SearchRequest("acme", query, vector, k=1, mode="dense"))
    assert "certificate expired" in dense[0].section
    exact = await index.search(SearchRequest("acme", "ERR-5120", vector, k=1, mode="bm25"))
    assert exact[0].section.startswith("ERR-5120")


async def test_a_version_that_landed_first_counts_as_unchanged(tmp_path: Path) -> None:
    class RacingIndex(EmbeddedRetriever):
        """Reports no stored hash, as if the identical version arrived after the check."""

        async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
            return {}

    async with RacingIndex(tmp_path / "index.sqlite3") as index:
        await ingest_documents("t", docs(2), FakeEmbedder(), index)
        report = await ingest_documents("t", docs(2), FakeEmbedder(), index)
    assert (report.unchanged, report.added, report.chunks) == (2, 0, 0)


async def test_a_document_without_a_passage_is_skipped_not_fatal_to_its_batch(
    tmp_path: Path,
) -> None:
    docs = [
        RawDocument("headings", "Headings", "# Only\n\n## Headings\n"),
        RawDocument("real", "Real", "Some real text about routers."),
    ]
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        report = await ingest_documents("t", docs, FakeEmbedder(), index)
        assert (report.added, report.empty) == (1, 1)
        assert await index.content_hash("t", "headings") is None


def test_reader_ids_and_texts_follow_the_api_s_rules(tmp_path: Path) -> None:
    (tmp_path / "cafe\u0301.md").write_text("# Cafe\u0301\n\nMenu\x00 and\r\nprices.")
    rows = [{"id": "re\u0301sume\u0301", "title": "T\x07", "text": "body\x1b"}]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    found = {d.doc_id: replace(d, source="") for d in read_paths([tmp_path])}
    # The NFC ids `PUT /v1/documents/caf%C3%A9.md` (or its NFD spelling) reaches.
    assert found["caf\u00e9.md"] == RawDocument(
        "caf\u00e9.md", "Caf\u00e9", "# Caf\u00e9\n\nMenu and\nprices."
    )
    assert found["r\u00e9sum\u00e9"] == RawDocument("r\u00e9sum\u00e9", "T", "body")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"id": "a\x00b", "text": "x"}, "doc_id: no control"),
        ({"id": "a\u200bb", "text": "x"}, "doc_id: no control, format"),
        ({"id": " a", "text": "x"}, "doc_id: no leading or trailing whitespace"),
        ({"id": "a/../b", "text": "x"}, "doc_id: no empty, '.' or '..' segment"),
        ({"id": "a" * 513, "text": "x"}, "doc_id: 1 to 512 characters"),
        ({"id": "a", "title": "\ud800", "text": "x"}, "title contains a lone UTF-16 surrogate"),
        ({"id": "a", "text": "x\udc00"}, "text contains a lone UTF-16 surrogate"),
    ],
)
def test_reader_refuses_an_id_or_text_the_api_refuses_naming_the_line(
    tmp_path: Path, record: dict[str, str], message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: ") as refused:
        list(read_paths([path]))
    assert message in str(refused.value)


def test_reader_refuses_a_file_whose_name_is_no_document_id(tmp_path: Path) -> None:
    (tmp_path / "bell\x07.md").write_text("text")
    with pytest.raises(ValueError, match=r"bell\x07\.md: doc_id: no control"):
        list(read_paths([tmp_path]))


def test_a_first_run_ingests_the_readme_example_pages_first_then_the_rest_by_id() -> None:
    ordered = load_in_ingest_order()
    assert tuple(d.doc_id for d in ordered[: len(README_PAGES)]) == README_PAGES
    rest = [d.doc_id for d in ordered[len(README_PAGES) :]]
    assert rest == sorted(rest)
    assert sorted(d.doc_id for d in ordered) == [d.doc_id for d in load_wiki_sample()]
