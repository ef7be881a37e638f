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


def _word_edge(text: str, index: int) -> bool:
    """Whether the character at `index` (outside the text counts) does not continue a word."""
    return index < 0 or index >= len(text) or not text[index].isalnum()


def _a_name(first: str) -> bool:
    return first.isupper() or first.isdigit()
