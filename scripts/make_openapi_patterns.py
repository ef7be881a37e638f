"""Writes into docs/openapi.yaml the two text rules of gateway/text.py as JSON Schema patterns,
so the document states exactly what the server refuses (an outside fuzzer holds it to that):

- `NonBlankText`: a text with at least one character that is not blank once cleaned
  (`is_blank(clean_text(c))`: white space, control, format and combining characters, the
  Hangul fillers), as a query, a document's text or a prompt must be;
- `DocumentId`: a document id as `gateway.text.doc_id` takes it (no control, format, private-use,
  unassigned or separator character, no edge white space, no empty, `.` or `..` segment, 1 to
  512 characters);
- `GroupName`: a group name of an access list as `backends.retrieval.access.access_list` takes
  it (no control, format or line/paragraph separator character, not only white space, 1 to 128
  characters).

The character classes follow this interpreter's Unicode database (`unicodedata`), as the
server's checks do; `tests/unit/test_openapi_patterns.py` fails when the document's patterns
differ from what this renders (then run `python scripts/make_openapi_patterns.py`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from backends.retrieval.access import MAX_GROUP_CHARS, InvalidGroups, access_list
from backends.retrieval.base import MAX_DOC_ID_CHARS
from gateway.text import InvalidText, clean_text, doc_id, is_blank

DOC = Path(__file__).resolve().parents[1] / "docs" / "openapi.yaml"
_SURROGATES = range(0xD800, 0xE000)
_INDENT = " " * 6
_WIDTH = 96


def blank(c: str) -> bool:
    return is_blank(clean_text(c))


def refused_in_id(c: str) -> bool:
    try:
        doc_id(f"a{c}a")  # inside an id: edge white space and segments are other rules
    except InvalidText:
        return True
    return False


def refused_in_group(c: str) -> bool:
    try:
        access_list([f"a{c}a"])  # inside a name: a name of white space only is another rule
    except InvalidGroups:
        return True
    return False


def _ranges(pred: Callable[[str], bool]) -> Iterator[tuple[int, int]]:
    start = last = None
    for cp in range(sys.maxunicode + 1):
        if cp in _SURROGATES or not pred(chr(cp)):
            continue
        if last is not None and cp == last + 1:
            last = cp
            continue
        if start is not None and last is not None:
            yield start, last
        start = last = cp
    if start is not None and last is not None:
        yield start, last


def _escape(cp: int) -> str:
    """A code point as a YAML double-quoted escape (the loaded pattern holds the character)."""
    if cp <= 0xFF:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def char_class(pred: Callable[[str], bool]) -> str:
    """The characters `pred` holds as one regex class body, escaped for YAML."""
    return "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in _ranges(pred))


def _space() -> str:
    return char_class(str.isspace)


def patterns() -> dict[str, str]:
    """Each generated schema's pattern, as the YAML source writes it (escapes, not characters)."""
    space, refused = _space(), char_class(refused_in_id)
    segments = r"(?!/)(?!.*//)(?!.*/$)(?!(?:.*/)?\\.\\.?(?:/|$))"
    return {
        "NonBlankText": f"[^{char_class(blank)}]",
        "DocumentId": (
            f"^(?![{space}])(?!.*[{space}]$){segments}[^{refused}]{{1,{MAX_DOC_ID_CHARS}}}$"
        ),
        "GroupName": (
            f"^(?=.*[^{space}])[^{char_class(refused_in_group)}]{{1,{MAX_GROUP_CHARS}}}$"
        ),
    }


def _folded(pattern: str) -> str:
    """`pattern` as a YAML double-quoted scalar over lines (a line ending in a backslash goes on
    without a space; the next line's indent is not part of it), never splitting an escape."""
    pieces = re.findall(r"\\U[0-9a-f]{8}|\\u[0-9a-f]{4}|\\x[0-9a-f]{2}|\\.|.", pattern)
    lines, line = [], ""
    for piece in pieces:
        if len(line) + len(piece) > _WIDTH:
            lines.append(line)
            line = ""
        line += piece
    lines.append(line)
    return "\\\n".join(f"{_INDENT}  {text}" if i else text for i, text in enumerate(lines))


def render(doc: str) -> str:
    """`doc` with each generated pattern rewritten between its markers."""
    for name, pattern in patterns().items():
        begin, end = f"# BEGIN generated: {name}", f"# END generated: {name}"
        block = re.compile(rf"({re.escape(begin)}\n)(.*?)(\n\s*{re.escape(end)})", re.S)
        if not block.search(doc):
            raise SystemExit(f"{DOC}: no {begin!r} ... {end!r} block")
        text = f'{_INDENT}pattern: "{_folded(pattern)}"'
        doc = block.sub(lambda m, text=text: m.group(1) + text + m.group(3), doc)
    return doc


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {DOC}")
