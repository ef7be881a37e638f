"""Whether a query names a document by its title: the entity-match signal of the rerank stage.

Most questions the lookup answers are about one named thing ("What is the population of
Texas?"), and the document titled with that name is the one to read first. The fused ranking
often puts another page about a related thing above it (a city of the country asked about, the
common-noun page "Gross domestic product" for "What is the GDP of Sweden?"): docs/reranking.md,
"Why the page is not first", counts them. A title is named when its base name, the title
without a trailing parenthesised qualifier ("Mercury (planet)") and without what follows its
first comma ("Salvador, Bahia"), occurs in the query as whole words, case-insensitively, and
the occurrence starts with a capital letter or a digit: a proper name, not a common noun the
question happens to use ("What is India's national anthem called?" names "India", not the page
"National anthem").

A question that asks which thing of a kind fits a description ("Which Italian astronomer
championed heliocentrism?", "In which city ...") names no page of its own: the names in it are
the description's ("Which coastal city in southeastern Kenya along the Indian Ocean?" is
Mombasa, not Kenya), so `asks_which` turns the signal off for it.

Plain string search, no regular expression: the query is client text.
"""

from __future__ import annotations


def base_name(title: str) -> str:
    """The title without a trailing "(qualifier)" and without what follows its first comma."""
    name = title.strip()
    if name.endswith(")") and "(" in name:
        name = name[: name.rindex("(")].rstrip()
    return name.split(",", 1)[0].strip()


def names_title(query: str, title: str) -> bool:
    """True when `query` names `title` (see the module docstring)."""
    name = base_name(title).lower()
    lowered = query.lower()
    if not name or len(lowered) != len(query):  # a case mapping that moves offsets: no claim
        return False
    start = lowered.find(name)
    while start >= 0:
        end = start + len(name)
        if _word_edge(lowered, start - 1) and _word_edge(lowered, end) and _a_name(query[start]):
            return True
        start = lowered.find(name, start + 1)
    return False


_COPULAS = frozenset({"is", "was", "are", "were"})
# After "What is"/"Who was": words that begin a named subject ("What is the GDP of Iran?",
# "What is Google's ...") rather than a description of an unnamed one ("What is located ...").
_SUBJECT_STARTS = frozenset({"the", "all", "this", "that", "these", "those"})


def asks_which(query: str) -> bool:
    """True for a question that describes the page it wants instead of naming it: "which" as
    its first or second word ("Which Italian astronomer ...", "In which city ..."), "Whose ...",
    or "What/Who" + is/was/are/were + a description ("What is located on the east bank of the
    Irrawaddy River?", "Who was a Roman emperor ...?", "What is the largest city in ...")."""
    words = [w.strip("\"'(").lower() for w in query.split(maxsplit=3)[:3]]
    if "which" in words[:2] or words[:1] == ["whose"]:
        return True
    if len(words) < 3 or words[0] not in ("what", "who") or words[1] not in _COPULAS:
        return False
    third, *rest = query.split(maxsplit=4)[2:]
    if third.lower() == "the" and rest:
        return _ranks(rest[0])  # "What is the largest city in Pakistan ...?"
    if third[:1].isdigit():
        return True  # "What is 432 km west-southwest from Algiers?"
    return third[:1].islower() and third.lower() not in _SUBJECT_STARTS and "'" not in third


_ORDINALS = frozenset({"first", "second", "third", "fourth", "fifth", "most", "least", "only"})


def _ranks(word: str) -> bool:
    """A superlative or ordinal ("largest", "second", "most"): it picks one thing out of a
    kind, which the question then describes."""
    lowered = word.lower()
    return lowered in _ORDINALS or (lowered.endswith("est") and len(lowered) > 5)


def _word_edge(text: str, index: int) -> bool:
    """Whether the character at `index` (outside the text counts) does not continue a word."""
    return index < 0 or index >= len(text) or not text[index].isalnum()


def _a_name(first: str) -> bool:
    return first.isupper() or first.isdigit()
