"""Extractive answers: with no model configured, the lookup answers with the sentences of its
top passages that best match the question, quoted verbatim and cited, in a few sentences.

How a sentence is chosen:
1. the top `PASSAGES` hits are split into sentences (`routers.sentences`), repeated ones (the
   chunks overlap) and fragments of fewer than `MIN_WORDS` words left out, at most
   `MAX_CANDIDATES` in all;
2. every candidate is embedded in one call to the gateway's embedder, with its passage's
   title and section before it, as the chunker's context line has them (a Wikipedia sentence
   says "He was born in Pisa", not whose birth it is), and scored by its cosine to the
   question's vector, the one the request already computed;
3. a candidate below `RELEVANCE_FLOOR` is never quoted, unless it (or its title or section)
   holds every identifier the question names ("ERR-4471": a code's embedding says little),
   so a passage none of whose sentences clears it is not cited; with none clearing it, the
   answer says the documents did not give one;
4. the rest are ordered by their cosine, and the
   best are taken while they fit: at most `MAX_SENTENCES` sentences and `MAX_CHARS` characters,
   and the client's `max_tokens` (counted by the embedder's tokenizer, else estimated at
   `CHARS_PER_TOKEN`).

The answer groups the quoted sentences by passage, its sentences in reading order followed by its
citation `[i]`. With a rerank stage configured, the first-ranked passage with a sentence to quote
leads and the passages come in the search's order: the stage's order weighs the cross-encoder,
fusion and the title signal, and names the page first more often than a sentence's cosine does.
With none, the passages come in the order of their best sentences (a sentence's cosine names the
page first more often than fusion alone). Figures behind the constants and the orders:
docs/answers.md and docs/benchmarks.md, "End to end: the first citation".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from backends.embeddings.base import Embedder, token_window
from backends.retrieval.base import Hit, Vector
from routers.features import identifiers_in
from routers.generation import inert_citations
from routers.sentences import split_sentences
from routers.types import Answer, Citation, Route

log = logging.getLogger(__name__)

PASSAGES = 4
MAX_CANDIDATES = 32
MIN_WORDS = 3
MAX_SENTENCES = 3
MAX_CHARS = 600
# The cosine (all-MiniLM-L6-v2) a sentence needs to be quoted: chosen on the tuning split of
# FanOutQA dev by bench/extractive_eval.py (docs/answers.md).
RELEVANCE_FLOOR = 0.425
# Tokens per character where the embedder has no tokenizer to count with: the usual estimate
# for English under an LLM's BPE (about 4 characters a token), rounded up per word.
CHARS_PER_TOKEN = 4
NO_ANSWER_TEXT = "The documents did not give an answer to this question."
_SNIPPET_CHARS = 300


@dataclass(frozen=True, slots=True)
class Candidate:
    """One sentence of a passage, and how well it matches the question."""

    passage: int  # the hit's place in the search's results, from 0
    position: int  # its place in the passage, from 0
    text: str
    similarity: float  # cosine to the question's vector
    # It, or its passage's title or section, holds every identifier the question names.
    names: bool = False

    def clears(self, floor: float) -> bool:
        """Relevant enough to quote: an identifier's exact match is evidence the embedding of
        an error code or SKU does not carry."""
        return self.names or self.similarity >= floor


@dataclass(frozen=True, slots=True)
class Scored:
    """What the sentences of a search's top passages say about one question."""

    candidates: tuple[Candidate, ...]  # best first, by similarity
    # Led by the search's first passage and cited in the search's order (a rerank stage
    # ordered it), not in the order of the passages' best sentences.
    search_order: bool = False

    @property
    def best_similarity(self) -> float:
        return max((c.similarity for c in self.candidates), default=0.0)


class Extractor:
    """Builds a lookup's extractive answer from its hits (see the module's docstring);
    `search_order`: the hits come from a rerank stage."""

    def __init__(self, embedder: Embedder, search_order: bool = False) -> None:
        self._embedder = embedder
        self._search_order = search_order
        window = token_window(embedder)
        self.count: Callable[[str], int] = window.count if window else estimate_tokens

    async def answer(
        self, query: str, vector: Vector, hits: Sequence[Hit], max_tokens: int | None
    ) -> Answer:
        scored = await self.score(query, vector, hits)
        return answer_from(scored, hits, self.count, max_tokens)

    async def score(self, query: str, vector: Vector, hits: Sequence[Hit]) -> Scored:
        """Every candidate sentence of the top passages, best first."""
        found = candidates(hits)
        if not found:
            return Scored((), self._search_order)
        texts = [f"{_context(hits[c.passage])}: {c.text}" for c in found]
        similarities = await self._embedder.embed(texts) @ np.asarray(vector, dtype=np.float32)
        wanted = [i.casefold() for i in identifiers_in(query)]
        scored = [
            Candidate(
                c.passage,
                c.position,
                c.text,
                float(s),
                bool(wanted) and all(i in text.casefold() for i in wanted),
            )
            for c, s, text in zip(found, similarities, texts, strict=True)
        ]
        return Scored(tuple(sorted(scored, key=lambda c: -c.similarity)), self._search_order)


def answer_from(
    scored: Scored,
    hits: Sequence[Hit],
    count: Callable[[str], int],
    max_tokens: int | None,
    floor: float = RELEVANCE_FLOOR,
) -> Answer:
    """The answer quoting the best of `scored` that reach `floor`, or saying there is none."""
    kept = [c for c in scored.candidates if c.clears(floor)]
    if not kept:
        note = (
            "no sentence of the top passages reached the relevance floor "
            f"({scored.best_similarity:.2f} < {floor:.2f})"
        )
        return Answer(NO_ANSWER_TEXT, Route.LOOKUP, extractive=True, complete=False, notes=(note,))
    if scored.search_order:
        kept = _led_by_first_passage(kept)
    return compose(choose(kept), hits, count, max_tokens, scored.search_order)


def _led_by_first_passage(ranked: Sequence[Candidate]) -> list[Candidate]:
    """`ranked` with the best sentence of the first-ranked passage that has one first, so the
    search's best passage is quoted and cited first."""
    top = min(c.passage for c in ranked)
    lead = next(c for c in ranked if c.passage == top)
    return [lead, *(c for c in ranked if c is not lead)]


def candidates(hits: Sequence[Hit]) -> list[Candidate]:
    """The sentences an answer may quote, in search order, without scores."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for passage, hit in enumerate(hits[:PASSAGES]):
        for position, sentence in enumerate(split_sentences(hit.text)):
            key = " ".join(sentence.split()).casefold()
            if len(sentence.split()) < MIN_WORDS or key in seen:
                continue
            seen.add(key)
            out.append(Candidate(passage, position, sentence, 0.0))
            if len(out) == MAX_CANDIDATES:
                return out
    return out


def choose(ranked: Sequence[Candidate]) -> list[Candidate]:
    """The best candidates that fit the answer's bounds, in rank order: the first always, cut
    at a word to `MAX_CHARS` when it is longer (a passage with no sentence end in it)."""
    chosen: list[Candidate] = []
    chars = 0
    for candidate in ranked:
        if len(chosen) == MAX_SENTENCES:
            break
        if chosen and chars + len(candidate.text) > MAX_CHARS:
            continue
        if len(candidate.text) > MAX_CHARS:
            candidate = replace(candidate, text=_clipped(candidate.text, MAX_CHARS))
        chosen.append(candidate)
        chars += len(candidate.text)
    return chosen


def _clipped(text: str, limit: int) -> str:
    """The first words of `text` (longer than `limit`) and "…", within `limit` characters; a
    first word longer than that is cut inside it."""
    head = text[: limit - 1]
    if not text[limit - 1].isspace() and len(head.split()) > 1:
        head = head.rsplit(None, 1)[0]  # the word the limit falls in
    return head.rstrip() + "…"


def compose(
    chosen: Sequence[Candidate],
    hits: Sequence[Hit],
    count: Callable[[str], int],
    max_tokens: int | None,
    search_order: bool = False,
) -> Answer:
    """The answer quoting `chosen` (rank order), cut to `max_tokens` when the client set it:
    the lowest-ranked sentences go first, then the best one is cut at a word. The passages
    are cited in the search's order with `search_order`, else in their best sentence's."""
    groups = _grouped(chosen, search_order)
    text = _text(groups)
    notes: tuple[str, ...] = ()
    cut = max_tokens is not None and count(text) > max_tokens
    if max_tokens is not None and cut:
        for n in range(len(chosen) - 1, 0, -1):
            groups = _grouped(chosen[:n], search_order)
            text = _text(groups)
            if count(text) <= max_tokens:
                break
        else:
            groups = _grouped(chosen[:1], search_order)
            text = _truncated(_quoted(groups[0]), max_tokens, count)
        notes = (f"the extractive answer was cut to max_tokens {max_tokens}",)
    return Answer(
        text,
        Route.LOOKUP,
        citations=tuple(_citation(hits[g[0].passage], g) for g in groups),
        extractive=True,
        complete=not cut,
        notes=notes,
        finish_reason="length" if cut else "stop",
    )


def _grouped(chosen: Sequence[Candidate], search_order: bool) -> list[list[Candidate]]:
    """Per passage, in search order or in the order of each passage's best; within one, in
    reading order."""
    groups: dict[int, list[Candidate]] = {}
    for candidate in chosen:
        groups.setdefault(candidate.passage, []).append(candidate)
    passages = sorted(groups) if search_order else list(groups)
    return [sorted(groups[p], key=lambda c: c.position) for p in passages]


def _text(groups: Sequence[Sequence[Candidate]]) -> str:
    return " ".join(f"{_quoted(g)} [{i}]" for i, g in enumerate(groups, 1))


def _quoted(group: Sequence[Candidate]) -> str:
    # The answer's [i] are its citations; the document's own brackets must not read as more.
    return inert_citations(" ".join(c.text for c in group))


def _truncated(quote: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The first words of `quote` and its citation within `max_tokens`; where not even the
    citation fits, only the words that do."""
    marker = " … [1]"
    words = _fitting(quote.split(), max_tokens - count(marker), count)
    if not words:
        return fit_tokens(quote, max_tokens, count)
    return " ".join(words) + marker


def fit_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The first words of `text` within `max_tokens`."""
    return " ".join(_fitting(text.split(), max_tokens, count))


def _fitting(words: Sequence[str], budget: int, count: Callable[[str], int]) -> list[str]:
    """The longest first run of `words` whose tokens fit `budget` (a word's pieces never
    depend on its neighbours: the tokenizer splits at white space first)."""
    out: list[str] = []
    for word in words:
        budget -= count(word)
        if budget < 0:
            break
        out.append(word)
    return out


def _citation(hit: Hit, group: Sequence[Candidate]) -> Citation:
    """The passage, its snippet what the answer quoted of it."""
    quoted = " ".join(c.text for c in group)
    snippet = quoted if len(quoted) <= _SNIPPET_CHARS else quoted[:_SNIPPET_CHARS] + "…"
    return Citation(hit.doc_id, hit.chunk_id, hit.title, snippet, round(hit.score, 6))


def _context(hit: Hit) -> str:
    """What the passage is about, as the chunker's context line says it: "title — section"."""
    return f"{hit.title} — {hit.section}" if hit.section else hit.title


def estimate_tokens(text: str) -> int:
    """Tokens of `text` at `CHARS_PER_TOKEN` characters a token, each word rounded up."""
    return sum(math.ceil(len(word) / CHARS_PER_TOKEN) for word in text.split())


def extractive_text(citations: tuple[Citation, ...]) -> str:
    """Passages quoted as an answer citing them, [i] for the i-th: what the agent answers with
    when its model fails mid-loop and no other may write it."""
    return "\n\n".join(
        f"[{i}] {inert_citations(c.title)}: {inert_citations(c.snippet)}"
        for i, c in enumerate(citations, 1)
    )
