"""Sentence splitting for extractive answers: a passage's text → its sentences, verbatim.

An extractive answer quotes whole sentences, so a wrong cut shows: "He was born in St." and
"Petersburg." are two bad quotes. The splitter is a linear scan over the places a sentence
may end (`.`, `!`, `?` or `…`, then closing quotes or brackets, then white space) that keeps
going where the text around says it is not an end:

- the next word starts in lower case ("approx. three", "... and then");
- the word before is a capital letter, an initial ("J. R. R. Tolkien", "George W. Bush"),
  unless it may be a Roman numeral before a usual opener ("World War I. In 1920"); or a
  small letter before a number, a label ("(b. 1950)"), where after a number it is a unit
  ("1.5 m. Adults weigh");
- the word before is a title or an abbreviation that is never last in a sentence ("Dr.",
  "Mt.", "vs.", "e.g.", "i.e.", "cf.", "et al.", "ca. 1500", "Jan. 3");
- the word before is an abbreviation that often is ("U.S.", "St.", "No.", "Inc.", "Bros.")
  and the next word does not usually open a sentence ("the U.S. Congress", "St. John",
  "No. 5" stay whole; "in the U.S. It is", "on Main St. The" are cut).

Decimals ("3.14", "$1.5 million") hold no white space and are never a candidate. Paragraphs
(a blank line) always end a sentence; a line that opens a list item or a heading starts one;
other line breaks are wrapped prose and read as spaces.
"""

from __future__ import annotations

import re

# A possible end: terminal marks, closing quotes or brackets, then the white space after.
# Possessive, and only from the first mark of a run, so a scan is linear ("." * 8000).
_END = re.compile(r"(?<![.!?…])[.!?…]++[\"'\u201d\u2019)\]]*+\s++")
_PARAGRAPH = re.compile(r"\n[ \t]*+\n")
_ITEM_START = re.compile(r"\n(?=[ \t]*+(?:[-*•+]\s|\d{1,3}[.)]\s|#{1,6}\s|\|))")

# Never the last word of a sentence before a capitalised or numbered word.
_NEVER_LAST = frozenset(
    "mr mrs ms mx dr prof rev hon sr mt ft gen col lt capt sgt maj adm gov sen rep pres "
    "vs cf al e.g i.e viz approx ca fl nos nr vol vols pp fig figs eq ch sec "
    "art op ed eds trans jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
# Often an abbreviation, sometimes the last word: cut only before a usual opener.
_AMBIGUOUS = frozenset("st no inc ltd co corp jr bros plc llc dept univ est".split())
_ROMAN = frozenset("IVX")
_ACRONYM = re.compile(r"(?:[A-Za-z]\.){2,}")
# Words that open most sentences; after an ambiguous abbreviation only these start one.
_OPENERS = frozenset(
    "the a an it its he she they we i you his her their our this that these those there "
    "in on at as after before during since when while however although though but and "
    "also then thus today later many most some one two both each other such".split()
)
_LOOK = 64  # characters: longer than any abbreviation or opener it compares
_QUOTES = "\"'\u201c\u2018([«"


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, in order, each stripped; none is empty."""
    sentences: list[str] = []
    for block in _PARAGRAPH.split(text):
        for unit in _ITEM_START.split(block):
            prose = " ".join(line.strip() for line in unit.split("\n"))
            sentences.extend(_split_prose(prose.strip()))
    return sentences


def _split_prose(prose: str) -> list[str]:
    out: list[str] = []
    start = 0
    for end in _END.finditer(prose):
        if end.end() >= len(prose):
            break  # the text's own end
        # A bounded look either side: the word before and the words after are all it reads.
        before = prose[max(start, end.start() - _LOOK) : end.start()]
        if _ends_here(before, prose[end.end() : end.end() + _LOOK], end.group()):
            out.append(prose[start : end.end()].strip())
            start = end.end()
    if rest := prose[start:].strip():
        out.append(rest)
    return out


def _ends_here(before: str, after: str, mark: str) -> bool:
    """Whether a sentence ends at `mark`, between `before` (its text so far) and `after`."""
    nxt = after.lstrip(_QUOTES)[:1]
    if not nxt or not (nxt.isupper() or nxt.isdigit()):
        return False  # lower case, or punctuation: the sentence goes on
    if mark[0] != ".":
        return True  # ! ? …: no abbreviation ends in them
    words = before.rsplit(None, 1)
    if not words:
        return True
    word = words[-1].lstrip(_QUOTES)
    bare = word.casefold()
    if len(word) == 1 and word.isalpha():
        if word.islower():  # a label before a number ("b. 1950"), else a unit ("1.5 m.")
            return not nxt.isdigit()
        if word in _ROMAN:  # "Justinian I. It was", "World War I. In 1920"
            return _opens_sentence(after)
        return False  # an initial
    if bare in _NEVER_LAST:
        return False
    if bare in _AMBIGUOUS or _ACRONYM.fullmatch(word + "."):
        return _opens_sentence(after)
    return True


def _opens_sentence(after: str) -> bool:
    first = after.lstrip(_QUOTES).split(maxsplit=1)[:1]
    return bool(first) and first[0].strip(",;:").casefold() in _OPENERS
