"""From a model's text to an Answer: which numbered sources it cited, and whether it answered."""

from __future__ import annotations

import re
from dataclasses import replace

from backends.llm.base import Completion, Usage
from backends.retrieval.base import Hit
from routers.types import Answer, Citation, Generation

_CITE = re.compile(r"\[(\d{1,3})\]")
NOT_FOUND = "The documents do not say."
_SNIPPET_CHARS = 300


def citation_from_hit(hit: Hit) -> Citation:
    snippet = hit.text if len(hit.text) <= _SNIPPET_CHARS else hit.text[:_SNIPPET_CHARS] + "…"
    return Citation(hit.doc_id, hit.chunk_id, hit.title, snippet, round(hit.score, 6))


def cited_sources(text: str, sources: tuple[Citation, ...]) -> tuple[Citation, ...]:
    """The sources the text cites, in order of first citation; out-of-range numbers ignored."""
    seen: list[int] = []
    for match in _CITE.finditer(text):
        n = int(match.group(1))
        if 1 <= n <= len(sources) and n not in seen:
            seen.append(n)
    return tuple(sources[n - 1] for n in seen)


def finish(generation: Generation, completion: Completion) -> Answer:
    text = completion.text.strip()
    citations = cited_sources(text, generation.sources)
    # A retrieval answer that cites nothing, or admits the sources lack it, is not a confident
    # answer: it is returned, but never cached.
    grounded = not generation.sources or bool(citations)
    complete = grounded and NOT_FOUND not in text and completion.finish_reason != "length"
    return Answer(
        text=text,
        route=generation.route,
        citations=citations,
        usage_by_tier={generation.tier: completion.usage},
        complete=complete,
    )


def usage_total(answer: Answer) -> Usage:
    total = Usage()
    for usage in answer.usage_by_tier.values():
        total = total + usage
    return total


def with_usage(answer: Answer, extra: dict[str, Usage]) -> Answer:
    """The answer with the usage of earlier calls (e.g. a rewrite) added to its tiers."""
    if not extra:
        return answer
    merged = dict(answer.usage_by_tier)
    for tier, usage in extra.items():
        merged[tier] = merged.get(tier, Usage()) + usage
    return replace(answer, usage_by_tier=merged)
