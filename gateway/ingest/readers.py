"""Reading documents from disk: .md, .txt, and .jsonl of {"id", "title", "text", "groups"}.

A jsonl record's optional `groups` is the document's access list (`backends.retrieval.access`):
left out, every user of the tenant may read it.

What the CLI ingests passes the rules the HTTP API applies (`gateway.text`): ids (a file's
relative path, a record's `id`) are canonical document ids, so a file named in NFD is stored
under the NFC id the API uses, and titles and texts are cleaned like a client's. What breaks a
rule is refused with an UnreadableInput naming the file (and line) and the rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from backends.retrieval.access import InvalidGroups, access_list
from gateway.ingest.chunker import heading
from gateway.text import InvalidText, clean_text, doc_id, is_blank

SUFFIXES = (".md", ".txt", ".jsonl")


class UnreadableInput(ValueError):
    """A file or line that cannot be ingested as it is; the message names it and the rule."""


@dataclass(frozen=True, slots=True)
class RawDocument:
    """A whole document before chunking. Empty text means: the document should not exist."""

    doc_id: str
    title: str
    text: str
    # Its access list, checked by `access_list`; None: every user of the tenant may read it.
    groups: tuple[str, ...] | None = None
    source: str = ""  # where it was read from (`source_of`); "" for a document PUT by the API


def read_paths(paths: Iterable[Path], source: str | None = None) -> Iterator[RawDocument]:
    """Documents from files and directories (searched recursively, in sorted order).

    A file's id is its path relative to the directory given (or its name, for a file given
    directly), so re-ingesting the same tree updates documents instead of duplicating them.
    Each document's source is `source` when given, else the path it was found under
    (`source_of`).
    """
    for path in paths:
        named = source_of(path, source)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
            for file in files:
                yield from (replace(d, source=named) for d in read_file(file, root=path))
        elif path.suffix in SUFFIXES:
            yield from (replace(d, source=named) for d in read_file(path, root=path.parent))
        else:
            raise UnreadableInput(f"{path}: not a directory or a {', '.join(SUFFIXES)} file")


def source_of(path: Path, name: str | None = None) -> str:
    """The source id of what is read from `path`: `name` when one is given, else the path
    resolved (absolute, links followed), so the same folder is one source from any directory."""
    return name if name is not None else path.resolve().as_posix()


def read_file(path: Path, root: Path) -> Iterator[RawDocument]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        yield from _jsonl_documents(path, text)
        return
    relative = path.relative_to(root).as_posix()
    # The title is looked for in the text as it will be stored: a heading of control
    # characters only ("# \x01") is blank once cleaned, and taken raw it would refuse the file.
    text = _clean(f"{path}", "text", text)
    yield _document(f"{path}", relative, title_of(text, path.stem), text)


def _document(
    where: str, raw_id: str, title: str, text: str, groups: tuple[str, ...] | None = None
) -> RawDocument:
    """The document with a canonical id and clean title and text, or an UnreadableInput saying
    `where` and which rule it breaks."""
    try:
        canonical = doc_id(raw_id)
    except InvalidText as exc:
        raise UnreadableInput(f"{where}: {exc}") from exc
    clean_title = _clean(where, "title", title)
    if is_blank(clean_title):  # the API's rule for a title sent (422)
        raise UnreadableInput(f"{where}: title is blank (white space or invisible characters only)")
    return RawDocument(canonical, clean_title, _clean(where, "text", text), groups)


def _clean(where: str, field: str, value: str) -> str:
    try:
        return clean_text(value)
    except InvalidText as exc:
        raise UnreadableInput(f"{where}: {field} {exc}") from exc


def title_of(text: str, fallback: str) -> str:
    """The first markdown heading that shows something, else the fallback (the file's stem)."""
    for line in text.splitlines():
        if (found := heading(line)) and not is_blank(found[1]):
            return found[1]
    return fallback


def _jsonl_documents(path: Path, text: str) -> Iterator[RawDocument]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            fields = (record["id"], record.get("title") or record["id"], record["text"])
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise UnreadableInput(f"{path}:{number}: want a JSON object with id and text") from exc
        if not all(isinstance(f, str) for f in fields):
            raise UnreadableInput(f"{path}:{number}: id, title and text must be strings")
        groups = None
        if record.get("groups") is not None:  # null, as left out: no access list
            try:
                groups = access_list(record["groups"])
            except InvalidGroups as exc:
                raise UnreadableInput(f"{path}:{number}: groups {exc}") from exc
        yield _document(f"{path}:{number}", *fields, groups)
