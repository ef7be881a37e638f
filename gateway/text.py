"""Client text, normalised once at the edge, before anything else reads it.

Every text a client sends (a query, history and chat message contents, a document's title and
text) passes `clean_text` while its request body is validated (`gateway.schemas.CleanStr`),
so the cache key, the tokenizer, the classifier and the backends only ever see clean text:

- a lone UTF-16 surrogate (JSON `"\\ud800"` without its pair) is not a character: the field is
  refused with 422 naming it (silently replacing it would change the question);
- line ends become `\\n` (`\\r\\n` and a lone `\\r`); tab and newline are kept; every other C0
  control character, DEL and the C1 controls (NUL included) are removed, since they carry no
  meaning in a question or a document and break tokenizers, logs and terminals;
- the result is in Unicode NFC, so one text has one spelling (a decomposed "é" matches "é").

A text that is blank after this is refused where blank text is (the query, a document's text).
"""

from __future__ import annotations

import re
import unicodedata

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]+")


class InvalidText(ValueError):
    """Text that cannot be normalised (lone surrogates); the message is safe to show."""


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
