"""From a model's text to an Answer: which numbered sources it cited, and whether it answered."""

from __future__ import annotations

import re

from backends.llm.base import Completion, Usage
from backends.retrieval.base import Hit
from routers.types import Answer, Citation, Generation, Route

_CITE = re.compile(r"\[(\d{1,3})\]")
# A chunk id in brackets ([errors.md#3]): never a marker the gateway issues, always invented.
_CHUNK_ID_CITE = re.compile(r"\[[^\[\]\s]{1,200}#\d+\]")
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


def drop_invented(text: str, sources: tuple[Citation, ...]) -> tuple[str, int]:
    """The text without citation markers that name no source given to the model, and how many
    were dropped: a citation must point at something that was actually retrieved."""
    dropped = 0

    def keep_or_drop(match: re.Match[str]) -> str:
        nonlocal dropped
        if 1 <= int(match.group(1)) <= len(sources):
            return match.group(0)
        dropped += 1
        return ""

    text = _CITE.sub(keep_or_drop, text)
    text, ids = _CHUNK_ID_CITE.subn("", text)
    return text, dropped + ids


def finish(generation: Generation, completion: Completion) -> Answer:
    """The one completion builder: a model's final text, streamed or not, becomes an Answer."""
    text = completion.text.strip()
    notes = generation.notes
    # Every route but direct answers from sources: a citation must name one it was given.
    from_sources = generation.route is not Route.DIRECT
    if from_sources:
        text, dropped = drop_invented(text, generation.sources)
        if dropped:
            text += f"\n\n({dropped} citation(s) to sources that were not retrieved removed.)"
            notes = (*notes, f"{dropped} invented citation(s) dropped")
    if not text:
        text, notes = NOT_FOUND, (*notes, "the model returned no text")
    citations = cited_sources(text, generation.sources)
    # An answer from sources that cites none, or admits they lack it, is not a confident
    # answer: it is returned, but never cached. Nor is one the token limit cut short.
    grounded = not from_sources or bool(citations)
    complete = grounded and NOT_FOUND not in text and completion.finish_reason != "length"
    if completion.finish_reason == "length":
        notes = (*notes, "the answer was cut at the token limit")
    usage = with_usage({generation.tier: completion.usage}, generation.usage_by_tier)
    return Answer(
        text=text,
        route=generation.route,
        citations=citations,
        usage_by_tier=usage,
        complete=complete and generation.escalation_reason is None,
        escalated=generation.escalation_reason is not None,
        escalation_reason=generation.escalation_reason,
        notes=notes,
        usage_estimated=completion.usage_estimated or generation.usage_estimated,
        steps=generation.steps,
        cap=generation.cap,
    )


def usage_total(answer: Answer) -> Usage:
    total = Usage()
    for usage in answer.usage_by_tier.values():
        total = total + usage
    return total


def with_usage(usage: dict[str, Usage], extra: dict[str, Usage]) -> dict[str, Usage]:
    """Usage per tier with that of other calls (a rewrite, the agent's turns) added in."""
    merged = dict(usage)
    for tier, more in extra.items():
        merged[tier] = merged.get(tier, Usage()) + more
    return merged
