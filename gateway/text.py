"""Client text, normalised once at the edge, before anything else reads it.

Every text a client sends (a query, history and chat message contents, a document's title and
text) passes `clean_text` while its request body is validated (`gateway.http.schemas.CleanStr`),
so the cache key, the tokenizer, the classifier and the backends only ever see clean text:

- a lone UTF-16 surrogate (JSON `"\\ud800"` without its pair) is not a character: the field is
  refused with 422 naming it (silently replacing it would change the question);
- line ends become `\\n` (`\\r\\n` and a lone `\\r`); tab and newline are kept; every other C0
  control character, DEL and the C1 controls (NUL included) are removed, since they carry no
  meaning in a question or a document and break tokenizers, logs and terminals;
- the result is in Unicode NFC, so one text has one spelling (a decomposed "é" matches "é").

A text that is blank after this is refused where blank text is (the query, a document's text):
`is_blank` counts as blank what shows nothing and means nothing on its own, see there.

Document ids have one canonical form wherever they come from (the HTTP path, a file ingested
by the CLI, a jsonl record's `id`), so one id is one document: `doc_id` checks a decoded id
and returns it in NFC; `canonical_doc_id` first percent-decodes a raw URL path remainder
exactly once (UTF-8). `/` is part of an id (ingested files are named by relative path), so
`a/b` and `a%2Fb` are the one id `a/b`, and `a%252Fb` is the id `a%2Fb`. Refused, naming the
rule: a `%` that starts no `%XX` escape, bytes that are not UTF-8, control or format
characters, leading or trailing whitespace, an empty, `.` or `..` segment (clients and proxies
rewrite those), more than `MAX_DOC_ID_CHARS` characters.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote_to_bytes

from backends.retrieval.base import MAX_DOC_ID_CHARS

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]+")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Control (Cc), format (Cf: zero-width and bidi marks), surrogate, private-use, unassigned,
# and line/paragraph separators: invisible or unprintable in an id.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


# Blank for `is_blank`: format characters (Cf: zero-width space and joiners, bidi marks, the
# BOM, soft hyphen, word joiner, tags) and combining marks (Mn, Mc, Me), which in a text with
# no other character have no base to attach to. White space is `str.isspace`.
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Mn", "Mc", "Me"})
# Letters by category (Lo) but Default_Ignorable in Unicode: the Hangul fillers render as
# nothing.
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")


class InvalidText(ValueError):
    """Text that cannot be normalised (lone surrogates) or an id breaking a rule; the message
    is safe to show."""


def clean_text(value: str) -> str:
    """`value` with control characters removed, line ends unified and NFC applied."""
    if (bad := _SURROGATE.search(value)) is not None:
        raise InvalidText(
            f"contains a lone UTF-16 surrogate (U+{ord(bad.group()):04X}) at character "
            f"{bad.start()}: not valid Unicode; send the character itself or its full pair"
        )
    if "\r" in value:
        value = value.replace("\r\n", "\n").replace("\r", "\n")
    value = _CONTROL.sub("", value)
    if value.isascii():
        return value  # ASCII is already NFC, and most traffic is ASCII
    return unicodedata.normalize("NFC", value)


def is_blank(value: str) -> bool:
    """True when `value` has nothing a reader or a model could take as content: only white
    space, format characters (Cf) and combining marks, so every mark has no base (a mark after
    a letter is content, and so is the letter), and the Hangul fillers.

    `str.strip()` alone would let "\u200b" or "\u200f\u0301" through as a question.
    Unassigned (Cn) and private-use (Co) characters count as content: a newer Unicode or a font
    may give them a glyph, and refusing text we cannot read is not ours to decide."""
    return all(
        c.isspace() or c in _INVISIBLE_LETTERS or unicodedata.category(c) in _INVISIBLE_CATEGORIES
        for c in value
    )


def canonical_doc_id(raw: str) -> str:
    """The canonical id of a raw (still percent-encoded) URL path remainder; raises
    InvalidText naming the rule it breaks."""
    if _BAD_ESCAPE.search(raw):
        raise InvalidText("doc_id: a '%' must start a %XX escape (write '%' as %25)")
    try:
        decoded = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidText("doc_id: percent-escapes must decode to UTF-8") from exc
    return doc_id(decoded)


def doc_id(value: str) -> str:
    """The canonical (NFC) form of a decoded document id; raises InvalidText naming the rule
    it breaks."""
    canonical = unicodedata.normalize("NFC", value)
    if not 1 <= len(canonical) <= MAX_DOC_ID_CHARS:
        raise InvalidText(f"doc_id: 1 to {MAX_DOC_ID_CHARS} characters")
    if any(unicodedata.category(c) in _REFUSED_CATEGORIES for c in canonical):
        raise InvalidText("doc_id: no control, format or unassigned characters")
    if canonical != canonical.strip():
        raise InvalidText("doc_id: no leading or trailing whitespace")
    if any(segment in ("", ".", "..") for segment in canonical.split("/")):
        raise InvalidText("doc_id: no empty, '.' or '..' segment between slashes")
    return canonical
