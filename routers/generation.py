"""From a model's text to an Answer: which issued sources it cited, and whether it answered."""

from __future__ import annotations

import re

from backends.errors import BackendError, BackendUnavailable, UpstreamRefused
from backends.llm.base import NO_OPTIONS, Completion, GenerationOptions, Usage
from backends.retrieval.base import Hit
from routers.prompts import MARKER_SHAPE
from routers.types import Answer, Citation, Generation, Route

# A bracket that may hold citations: `[k7q3x9m2-1]`, `[k7q3x9m2-1, k7q3x9m2-2]`, `[3]`.
_BRACKET = re.compile(r"\[([^\[\]\n]{1,200})\]")
_BRACKET_INNER_MAX = 200
_TOKEN_SEPARATOR = re.compile(r"[\s,;]+")
# Never a marker the gateway issues, so always invented: a bare number (a document's "[2]" or
# a model's habit) and a chunk id (`errors.md#3`).
_NUMBER = re.compile(r"\d{1,3}")
_CHUNK_ID = re.compile(r"[^\[\]\s]{1,200}#\d+")
NOT_FOUND = "The documents do not say."
_SNIPPET_CHARS = 300


def citation_from_hit(hit: Hit) -> Citation:
    snippet = hit.text if len(hit.text) <= _SNIPPET_CHARS else hit.text[:_SNIPPET_CHARS] + "…"
    return Citation(hit.doc_id, hit.chunk_id, hit.title, snippet, round(hit.score, 6))


class Citer:
    """Maps the markers issued in this request (`[tag-n]`, n from 1 to `count`) to the
    client's `[k]`, where k is the source's place in the answer's citations (first cited,
    first). Every other citation-like bracket (a bare number, a chunk id, a marker with
    another tag or out of range) is dropped and counted; other bracketed text is left alone.

    Stateful, so a streamed answer is rewritten piece by piece exactly as the whole text
    would be (see `CitationStream`)."""

    def __init__(self, tag: str | None, count: int) -> None:
        self._tag = tag.casefold() if tag else None
        self._count = count
        self.order: list[int] = []  # cited source numbers, first citation first
        self.dropped = 0
        # The character before the text being rewritten (a stream arrives in pieces).
        self._before = ""

    def rewrite(self, text: str) -> str:
        before, self._before = self._before, text[-1:] or self._before
        return _BRACKET.sub(
            lambda m: self._bracket(m, text[m.start() - 1] if m.start() else before), text
        )

    def _bracket(self, match: re.Match[str], before: str) -> str:
        tokens = [t for t in _TOKEN_SEPARATOR.split(match.group(1)) if t]
        sources = [self._source(t) for t in tokens]
        ours = any(self._is_ours(t) for t in tokens)
        # `items[0]`, `x[1][2]`: an index, not a citation, unless it holds one of our markers.
        # Nothing before (the answer's start) is no index: `"" in "_])"` would say it is.
        indexing = before != "" and (before.isalnum() or before in "_])")
        if not tokens or (not ours and (indexing or any(s is None for s in sources))):
            return match.group(0)  # not a citation: "[sic]", "[see below]", "a[0]"
        # Prose mixed into a bracket of ours ("[tag-1, page 4]") is dropped, not counted.
        prose = any(n is None for n in sources)
        out = []
        for n in sources:
            if not n:
                self.dropped += not prose
                continue
            if n not in self.order:
                self.order.append(n)
            out.append(f"[{self.order.index(n) + 1}]")
        return "".join(out)

    def _is_ours(self, token: str) -> bool:
        return (
            bool(MARKER_SHAPE.fullmatch(token)) and token.casefold().rpartition("-")[0] == self._tag
        )

    def _source(self, token: str) -> int | None:
        """The issued source a token cites; 0 for a citation of none; None: not a citation."""
        if MARKER_SHAPE.fullmatch(token):
            tag, _, n = token.casefold().rpartition("-")
            return int(n) if tag == self._tag and 1 <= int(n) <= self._count else 0
        if _NUMBER.fullmatch(token) or _CHUNK_ID.fullmatch(token):
            return 0
        return None


def inert_citations(text: str) -> str:
    """A document's text quoted in an answer (the extractive lookup): a bracket that reads as
    a citation there (`[2]`, `[tag-1]`, `[errors.md#3]`) becomes `(2)`, so a document cannot
    point the client at another source's number."""

    def inert(match: re.Match[str]) -> str:
        before = text[match.start() - 1] if match.start() else ""
        if before.isalnum() or (before != "" and before in "_])"):
            return match.group(0)  # an index, `items[0]`, as `Citer` reads it
        tokens = [t for t in _TOKEN_SEPARATOR.split(match.group(1)) if t]
        cites = tokens and all(
            MARKER_SHAPE.fullmatch(t) or _NUMBER.fullmatch(t) or _CHUNK_ID.fullmatch(t)
            for t in tokens
        )
        return f"({match.group(1)})" if cites else match.group(0)

    return _BRACKET.sub(inert, text)


class CitationStream:
    """A streamed answer's text rewritten as `finish` rewrites the whole: text is held back
    only from a `[` that may still open a citation until that bracket closes or cannot."""

    def __init__(self, generation: Generation) -> None:
        sourced = generation.route is not Route.DIRECT
        self._citer = Citer(generation.source_tag, len(generation.sources)) if sourced else None
        self._pending = ""

    def feed(self, text: str) -> str:
        if self._citer is None:
            return text
        self._pending += text
        cut = self._pending.rfind("[")
        rest = self._pending[cut + 1 :]
        if cut < 0 or "]" in rest or "\n" in rest or len(rest) > _BRACKET_INNER_MAX:
            cut = len(self._pending)
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return self._citer.rewrite(ready)

    def flush(self) -> str:
        ready, self._pending = self._pending, ""
        return self._citer.rewrite(ready) if self._citer is not None else ready


def finish(generation: Generation, completion: Completion) -> Answer:
    """The one completion builder: a model's final text, streamed or not, becomes an Answer."""
    text = completion.text.strip()
    notes = generation.notes
    # Every route but direct answers from sources: a citation must be a marker issued for one
    # of them in this request; anything else that looks like one is dropped.
    from_sources = generation.route is not Route.DIRECT
    citations: tuple[Citation, ...] = ()
    if from_sources:
        citer = Citer(generation.source_tag, len(generation.sources))
        text = citer.rewrite(text)
        if citer.dropped:
            text += f"\n\n({citer.dropped} citation(s) to sources that were not retrieved removed.)"
            notes = (*notes, f"{citer.dropped} invented citation(s) dropped")
        citations = tuple(generation.sources[n - 1] for n in citer.order)
    # Client tools are offered on the direct route only: a call elsewhere names a tool the
    # client never defined (the agent's own search, say) and is not the client's to run.
    tool_calls = () if from_sources else completion.tool_calls
    if from_sources and completion.tool_calls:
        notes = (*notes, "a tool call the model made with no tools offered was dropped")
    if not text and not tool_calls:
        text, notes = NOT_FOUND, (*notes, "the model returned no text")
    # An answer from sources that cites none, or admits they lack it, is not a confident
    # answer: it is returned, but never cached. Nor is one the token limit cut short, nor a
    # call of the client's tools (the conversation goes on with their results).
    grounded = not from_sources or bool(citations)
    complete = grounded and NOT_FOUND not in text and completion.finish_reason != "length"
    complete = complete and not tool_calls
    if completion.cut is not None:
        notes = (*notes, f"the model's reply passed the gateway's {completion.cut} bound: cut")
    elif completion.finish_reason == "length":
        notes = (*notes, "the answer was cut at the token limit")
    finish_reason = "length" if completion.finish_reason == "length" else "stop"
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
        tool_calls=tool_calls,
        finish_reason="tool_calls" if tool_calls else finish_reason,
        reply_cut=completion.cut,
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


def failure_kind(failure: BackendError) -> str:
    """A model failure as an answer's note may name it: never the upstream's own text."""
    if isinstance(failure, BackendUnavailable):
        return "upstream unavailable"
    if isinstance(failure, UpstreamRefused):
        return "request refused"
    return "upstream error"


def clients_fault(failure: BackendError, options: GenerationOptions) -> bool:
    """Refused as invalid with the client's own parameters: theirs to fix (a 400), and any
    degraded answer's call, which carries them too, would be refused the same way."""
    return isinstance(failure, UpstreamRefused) and options != NO_OPTIONS
