"""`querygate eval`'s labelled files: one JSON object a line, checked as the gateway checks a
question, every refusal naming the file and line.

Routes: each line `{"question": str, "route": "direct|lookup|multihop|full_context",
"history"?: [{"role", "content"}], "id"?: str, "note"?: str}`.
Retrieval: each line `{"question": str, "relevant": [doc_id, ...], "id"?, "note"?}`; the ids
are read in the canonical form ingest stores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.llm.base import Message
from gateway.eval.errors import EvalError
from gateway.text import InvalidText, clean_text, doc_id, is_blank
from routers.types import Route

ROUTE_LABELS = tuple(r.value for r in Route)
_ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class RouteExample:
    line: int
    question: str
    route: Route
    history: tuple[Message, ...] = ()
    label: str | None = None  # the line's own "id"


@dataclass(frozen=True, slots=True)
class RetrievalExample:
    line: int
    question: str
    relevant: tuple[str, ...]
    label: str | None = None


def read_route_examples(path: Path, max_chars: int) -> list[RouteExample]:
    examples = []
    for where, record in _records(path, {"question", "route", "history", "id", "note"}):
        route = record.get("route")
        if route not in ROUTE_LABELS:
            raise EvalError(f"{where}: route must be one of {', '.join(ROUTE_LABELS)}")
        examples.append(
            RouteExample(
                where.line,
                _question(where, record, max_chars),
                Route(route),
                _history(where, record.get("history", [])),
                _label(where, record),
            )
        )
    return examples


def read_retrieval_examples(path: Path, max_chars: int) -> list[RetrievalExample]:
    examples = []
    for where, record in _records(path, {"question", "relevant", "id", "note"}):
        relevant = record.get("relevant")
        if not isinstance(relevant, list) or not relevant:
            raise EvalError(f"{where}: relevant must be a non-empty list of document ids")
        ids = []
        for n, raw in enumerate(relevant):
            if not isinstance(raw, str):
                raise EvalError(f"{where}: relevant[{n}] must be a string")
            try:
                ids.append(doc_id(raw))  # the canonical form ingest stores
            except InvalidText as exc:
                raise EvalError(f"{where}: relevant[{n}]: {exc}") from exc
        question = _question(where, record, max_chars)
        examples.append(
            RetrievalExample(where.line, question, tuple(dict.fromkeys(ids)), _label(where, record))
        )
    return examples


@dataclass(frozen=True, slots=True)
class _Where:
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def _records(path: Path, fields: set[str]) -> Iterator[tuple[_Where, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EvalError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise EvalError(f"{path}: {exc.strerror or exc}") from exc
    found = False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = _Where(path, number)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{where}: not JSON ({exc.msg}, column {exc.colno})") from exc
        if not isinstance(record, dict):
            raise EvalError(f"{where}: want a JSON object, got {type(record).__name__}")
        if unknown := sorted(set(record) - fields):
            raise EvalError(
                f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(fields))})"
            )
        found = True
        yield where, record
    if not found:
        raise EvalError(f"{path}: no labelled questions (one JSON object a line)")


def _question(where: _Where, record: dict[str, Any], max_chars: int) -> str:
    value = record.get("question")
    if not isinstance(value, str):
        raise EvalError(f"{where}: question must be a string")
    question = _clean(where, "question", value).strip()
    if is_blank(question):  # the gateway's rule: it would refuse the question with 422
        raise EvalError(f"{where}: question is blank (white space or invisible characters only)")
    if len(question) > max_chars:
        raise EvalError(
            f"{where}: question is over server.max_query_chars ({max_chars}): the gateway "
            "would refuse it"
        )
    return question


def _history(where: _Where, value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list):
        raise EvalError(f"{where}: history must be a list of {{role, content}} objects")
    messages = []
    for n, item in enumerate(value):
        field = f"history[{n}]"
        if not isinstance(item, dict) or set(item) != {"role", "content"}:
            raise EvalError(f"{where}: {field} must be an object with role and content only")
        if item["role"] not in _ROLES:
            raise EvalError(f"{where}: {field}.role must be user or assistant")
        if not isinstance(item["content"], str):
            raise EvalError(f"{where}: {field}.content must be a string")
        messages.append(Message(item["role"], _clean(where, f"{field}.content", item["content"])))
    return tuple(messages)


def _label(where: _Where, record: dict[str, Any]) -> str | None:
    for field in ("id", "note"):
        if field in record and not isinstance(record[field], str):
            raise EvalError(f"{where}: {field} must be a string")
    label = record.get("id")
    return label if isinstance(label, str) else None


def _clean(where: _Where, field: str, value: str) -> str:
    try:
        return clean_text(value)
    except InvalidText as exc:
        raise EvalError(f"{where}: {field} {exc}") from exc
