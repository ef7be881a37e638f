"""One blank rule (`gateway.text.is_blank`) for the API, `querygate ingest` and `querygate eval`:
text of white space and invisible characters only (zero-width space, bidi marks) is blank."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.retrieval.embedded import EmbeddedRetriever
from gateway.eval.errors import EvalError
from gateway.eval.examples import read_retrieval_examples, read_route_examples
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import RawDocument, UnreadableInput, read_paths
from tests.unit.test_ingest import FakeEmbedder

INVISIBLE = "\u200b\u200e \u2060\n"


async def test_an_invisible_only_document_is_not_ingested_and_is_named(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        report = await ingest_documents(
            "t", [RawDocument("ghost", "Ghost", INVISIBLE)], embedder, index
        )
        assert (report.added, report.blank_ids) == (0, ["ghost"])
        assert embedder.calls == []
        assert await index.stats("t") == (0, 0)


async def test_an_invisible_only_version_deletes_the_stored_one_like_an_empty_file(
    tmp_path: Path,
) -> None:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        await ingest_documents("t", [RawDocument("d", "D", "Real text.")], FakeEmbedder(), index)
        report = await ingest_documents(
            "t", [RawDocument("d", "D", INVISIBLE)], FakeEmbedder(), index
        )
        assert (report.deleted, report.blank_ids) == (1, ["d"])
        assert await index.stats("t") == (0, 0)


@pytest.mark.parametrize("read", [read_route_examples, read_retrieval_examples])
def test_an_invisible_only_eval_question_is_an_error_naming_its_line(
    tmp_path: Path, read: Callable[[Path, int], list[Any]]
) -> None:
    path = tmp_path / "eval.jsonl"
    rows = [
        {"question": "What is ERR-4471?", "route": "lookup", "relevant": ["a"]},
        {"question": "\u200b\u200e", "route": "lookup", "relevant": ["a"]},
    ]
    fields = {"question", "route"} if read is read_route_examples else {"question", "relevant"}
    path.write_text("\n".join(json.dumps({k: r[k] for k in fields}) for r in rows) + "\n")
    with pytest.raises(EvalError, match=r"eval\.jsonl:2: question is blank"):
        read(path, 2000)


def test_a_file_s_invisible_heading_is_not_its_title(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# \u200b\u200e\n\nSome notes.\n", encoding="utf-8")
    (doc,) = read_paths([path])
    assert doc.title == "notes"


def test_a_jsonl_record_with_a_blank_title_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [{"id": "a", "text": "alpha"}, {"id": "b", "title": "\u200b \u200e", "text": "beta"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(UnreadableInput, match=r"docs\.jsonl:2: title is blank"):
        list(read_paths([path]))
