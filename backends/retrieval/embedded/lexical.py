"""A query's lexical terms, and the bound on what FTS5 is asked to score for them.

FTS5 scores every row matching any term before it sorts: a word in every chunk of a 60k-chunk
tenant costs ~140 ms a search, whatever the LIMIT. So when the rows the terms match (the sum of
their document frequencies, read from an fts5vocab table at a fraction of the cost) exceed
`row_budget`, and the tenant has more rows than that, terms are kept rarest first while they
fit, and a term in half the tenant's rows or more is never kept: FTS5's BM25 clamps its idf
(log((N - n + 0.5) / (n + 0.5)) <= 0) to 1e-6, so it moves no score. The rarest term with an
idf is kept even past the budget (its cost is under half the rows). Tenants with no more rows
than the budget are never pruned: their queries are scored as typed.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from backends.retrieval.embedded.state import IndexState
from backends.retrieval.stopwords import without_stopwords

# Rows one lexical query may have FTS5 score: ~1/6 of the 60k-chunk tenant that costs ~140 ms.
LEXICAL_ROW_BUDGET = 10_000
_QUERY_TOKEN = re.compile(r"[\w-]+")


def query_terms(text: str, max_chars: int = 1000, max_terms: int = 32) -> list[str]:
    """User text as unique lower-cased terms, stopwords dropped unless nothing else is left.

    Each term is a run of word characters, '-' and '_', so it can never hold a quote."""
    text = unicodedata.normalize("NFKC", text)[:max_chars]
    terms = [t.lower() for t in _QUERY_TOKEN.findall(text) if any(ch.isalnum() for ch in t)]
    return without_stopwords(list(dict.fromkeys(terms)))[:max_terms]


def fts_expression(terms: Sequence[str]) -> str:
    """An OR of quoted terms ("" for none): quoting makes FTS5 read operators (NEAR, AND, *, :,
    parentheses) as plain words."""
    return " OR ".join(f'"{t}"' for t in terms)


def fts_query(text: str, max_chars: int = 1000, max_terms: int = 32) -> str:
    """User text as an FTS5 expression, unbounded: an OR of quoted terms, or ""."""
    return fts_expression(query_terms(text, max_chars, max_terms))


def affordable_terms(
    state: IndexState, tenant: str, table: str, terms: Sequence[str], row_budget: int | None
) -> list[str]:
    """The terms FTS5 scores for this query on the tenant's `table` (None: no bound)."""
    if row_budget is None or not terms:
        return list(terms)
    frequency = {term: _document_frequency(state, table, term) for term in terms}
    if sum(frequency.values()) <= row_budget:
        return list(terms)
    rows = _rows(state, tenant)
    if rows <= row_budget:
        return list(terms)
    kept: list[str] = []
    scored = 0
    for term in sorted(terms, key=lambda t: (frequency[t], t)):
        n = frequency[term]
        if 2 * n >= rows or (kept and scored + n > row_budget):
            break
        kept.append(term)
        scored += n
    return kept


def _document_frequency(state: IndexState, table: str, term: str) -> int:
    vocab = _vocab(state, table)
    row = state.db.execute(f"SELECT doc FROM {vocab} WHERE term = ?", (term,)).fetchone()
    return 0 if row is None else int(row[0])


def _rows(state: IndexState, tenant: str) -> int:
    # Counted on the chunks index (one FTS row per chunk): FTS5 has no cheaper count in SQL.
    (rows,) = state.db.execute("SELECT count(*) FROM chunks WHERE tenant = ?", (tenant,)).fetchone()
    return int(rows)


def _vocab(state: IndexState, table: str) -> str:
    """The connection's fts5vocab table over `table` (TEMP: nothing is written to the file)."""
    vocab = f"temp.vocab_{table}"
    if vocab not in state.vocab_tables:
        state.db.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {vocab} USING fts5vocab(main, {table}, row)"
        )
        state.vocab_tables.add(vocab)
    return vocab
