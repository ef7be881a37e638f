"""English function words, left out of lexical queries and of evidence coverage.

BM25 gives them almost no weight, yet a lexical engine must score every row they match:
dropping them makes lexical queries faster and OpenSearch's BM25 recall higher
(bench/retrieval_eval.py, the `-stop` variants; docs/benchmarks.md).
"""

from __future__ import annotations

STOPWORDS = frozenset(
    (
        "a an and are as at be been but by can could did do does for from had has have how i if "
        "in into is it its of on or that the their them then there these they this those to was "
        "were what when where which who whom whose why will with would you your about after "
        "before than same both each all any many much more most other some such only own so too "
        "very just also"
    ).split()
)


def without_stopwords(terms: list[str]) -> list[str]:
    """The content terms, or all of them when nothing else is left ("The Who")."""
    return [t for t in terms if t.casefold() not in STOPWORDS] or terms
