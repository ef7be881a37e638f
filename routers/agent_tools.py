"""The agent's two tools, `search` and `read`, bound to one tenant for one request.

The tenant is fixed when the tools are built, never taken from the model's arguments: whatever
a model or a document's text asks for, the tools only reach the requesting tenant's chunks.
Arguments are validated strictly (unknown keys, wrong types and out-of-range values are
refused with a message the model can act on). `read` only opens documents that `search` has
returned in this loop, so it cannot be used to probe for document ids.

Every chunk handed to the model gets a source number on first sight and is shown as that
source of the request (`routers.prompts.format_source`: delimited, its text made inert); the
final answer may cite only the markers issued for those (`routers.generation.finish` drops any
other), so a document's text cannot forge a citation.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from backends.embeddings.base import Embedder
from backends.errors import BackendError
from backends.llm.base import ToolCall
from backends.retrieval.access import NO_GROUPS, Groups
from backends.retrieval.base import (
    MAX_DOC_ID_CHARS,
    MAX_DOCUMENT_CHUNKS,
    FusionMethod,
    Hit,
    Retriever,
    SearchRequest,
)
from routers.generation import citation_from_hit
from routers.grading import content_words
from routers.prompts import (
    CHUNK_CHARS,
    format_source,
    new_source_tag,
    shown_above,
    shown_doc_id,
)
from routers.rerank import RERANK_OFF, RerankCall, RerankRecorder, RerankStage
from routers.types import ChunkGrade, Citation, SpanOpener, ToolRun, ToolStatus, no_span

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 300
MAX_SEARCH_K = 10
_CHUNK_NUMBER = re.compile(r"#(\d+)$")

# JSON-schema function specs: the form litellm takes for every provider and translates.
TOOL_SPECS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Hybrid search over the documents. Returns numbered passages.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for"},
                    "k": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_K},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "More of a document a search returned: the passages around it.",
            "parameters": {
                "type": "object",
                "properties": {"doc_id": {"type": "string"}},
                "required": ["doc_id"],
                "additionalProperties": False,
            },
        },
    },
)
TOOL_NAMES = frozenset(spec["function"]["name"] for spec in TOOL_SPECS)


@dataclass(frozen=True, slots=True)
class SearchRerank:
    """The rerank stage as the `search` tool runs it for one request."""

    stage: RerankStage = RERANK_OFF
    recorder: RerankRecorder | None = None
    deadline: float | None = None  # the request's, a `time.monotonic()` instant


@dataclass(frozen=True, slots=True)
class ToolLimits:
    search_k: int
    candidates: int
    read_max_chunks: int
    timeout_s: float
    # A passage is kept for the model when its dense similarity to the search reaches this, or
    # when it holds most of the search's content words (the lexical arm's kind of relevance).
    min_similarity: float
    min_word_overlap: float = 0.5
    fusion: FusionMethod | None = None  # None: the retriever's own


class InvalidArguments(ValueError):
    """The model's arguments for a tool cannot be used; the message tells it why."""


@dataclass(slots=True)
class SourceBook:
    """Chunks the loop has shown the model, numbered from 1 in the order first seen, under
    the request's source tag."""

    tag: str = field(default_factory=new_source_tag)
    citations: list[Citation] = field(default_factory=list)
    # The passages behind the citations, same order: what a forced final answer is written from.
    passages: list[Hit] = field(default_factory=list)
    _numbers: dict[str, int] = field(default_factory=dict)
    _chunks_by_doc: dict[str, set[int]] = field(default_factory=dict)
    # A document id as the sources show it (made safe to print) -> the id itself.
    _docs_shown: dict[str, str] = field(default_factory=dict)

    def number(self, hit: Hit) -> tuple[int, bool]:
        """The chunk's source number, and whether it is new."""
        known = self._numbers.get(hit.chunk_id)
        if known is not None:
            return known, False
        self.citations.append(citation_from_hit(hit))
        self.passages.append(hit)
        self._numbers[hit.chunk_id] = len(self.citations)
        self._chunks_by_doc.setdefault(hit.doc_id, set()).add(_position(hit.chunk_id))
        self._docs_shown.setdefault(shown_doc_id(hit.doc_id, self.tag), hit.doc_id)
        return len(self.citations), True

    def shown_document(self, doc_id: str) -> str | None:
        """The id of the document a source showed as `doc_id`; None for one never shown."""
        return self._docs_shown.get(doc_id)

    def seen_positions(self, doc_id: str) -> set[int] | None:
        """Positions of the document's chunks already shown; None for a document never shown."""
        return self._chunks_by_doc.get(doc_id)


def _position(chunk_id: str) -> int:
    match = _CHUNK_NUMBER.search(chunk_id)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True, slots=True)
class _Shown:
    """What a tool showed the model: the text, the chunks in it, and the search's grades."""

    content: str
    chunk_ids: tuple[str, ...] = ()
    grades: tuple[ChunkGrade, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str  # what the model reads
    run: ToolRun  # what the trace shows


class AgentTools:
    def __init__(
        self,
        tenant: str,
        retriever: Retriever,
        embedder: Embedder,
        limits: ToolLimits,
        book: SourceBook,
        rerank: SearchRerank | None = None,
        groups: Groups = NO_GROUPS,
        span: SpanOpener = no_span,
    ) -> None:
        self._tenant = tenant
        # The end user's groups: searches and reads see only the documents they may read.
        self._groups = groups
        self._span = span
        self._rerank = rerank or SearchRerank()
        self._retriever = retriever
        self._embedder = embedder
        self._limits = limits
        self._book = book
        self._searched: set[str] = set()
        # Searches running now: the same search asked twice in one turn runs once.
        self._running: set[str] = set()

    async def run(self, call: ToolCall) -> ToolResult:
        """Run one tool call, as a span of its own; every failure becomes a message to the
        model, never an error."""
        # The model names the tool: only the ones it has are names of a closed set.
        name = call.name if call.name in TOOL_NAMES else "unknown"
        with self._span("agent_tool", {"querygate.tool": name}) as span:
            result = await self._run(call)
            if isinstance(span, Span):
                span.set_attribute("querygate.tool.status", result.run.status)
            return result

    async def _run(self, call: ToolCall) -> ToolResult:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._limits.timeout_s):
                shown = await self._dispatch(call)
        except InvalidArguments as exc:
            return _failed(call, "invalid_arguments", str(exc), started)
        except TimeoutError:
            return _failed(call, "timeout", "the tool timed out; try again or answer", started)
        except BackendError:
            return _failed(call, "unavailable", "the tool failed; try again or answer", started)
        except Exception:
            # A bug must not fail the request, nor leave the turn's other calls unowned.
            log.exception("agent tool %s failed", call.name[:40])
            return _failed(call, "failed", "the tool failed; answer from what you have", started)
        dropped = sum(1 for g in shown.grades if not g.kept)
        run = ToolRun(
            call.name, call.arguments, "ok", shown.chunk_ids, dropped, _ms(started), shown.grades
        )
        return ToolResult(shown.content, run)

    def refused(self, call: ToolCall, cap: str) -> ToolResult:
        """The answer to a call the loop will not run."""
        return _failed(call, "cap_reached", f"not run: {cap} is reached", time.perf_counter())

    async def _dispatch(self, call: ToolCall) -> _Shown:
        if call.error is not None:
            raise InvalidArguments(f"arguments were not a JSON object ({call.error})")
        if call.name == "search":
            query, k = self._search_args(call.arguments)
            return await self._search(query, k)
        if call.name == "read":
            return await self._read(_read_args(call.arguments))
        raise InvalidArguments(f"unknown tool {call.name[:40]!r}; the tools are search and read")

    def _search_args(self, args: dict[str, Any]) -> tuple[str, int]:
        _only(args, {"query", "k"})
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            raise InvalidArguments("search needs a non-empty string 'query'")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidArguments(f"'query' is longer than {MAX_QUERY_CHARS} characters")
        if not query.isascii():
            try:  # a lone surrogate is no text: the tokenizer raised on it, logged as a bug
                query.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArguments("'query' is not valid Unicode text") from None
        k = args.get("k", self._limits.search_k)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SEARCH_K:
            raise InvalidArguments(f"'k' must be an integer from 1 to {MAX_SEARCH_K}")
        return query.strip(), k

    async def _search(self, query: str, k: int) -> _Shown:
        normalised = " ".join(query.casefold().split())
        if normalised in self._searched:
            return _Shown("You already ran this search; its passages are above.")
        if normalised in self._running:
            return _Shown("Another call of this turn runs this same search; see its result.")
        self._running.add(normalised)
        try:
            hits = await self._searched_hits(query, k)
        finally:
            self._running.discard(normalised)
        # Only a search that ran counts as done: a failed one may be retried.
        self._searched.add(normalised)
        grades = tuple(
            ChunkGrade(h.chunk_id, h.dense_score, self._relevant(query, h)) for h in hits
        )
        kept = [h for h, g in zip(hits, grades, strict=True) if g.kept]
        if not kept:
            return _Shown(f"No relevant passages for {query!r}; try other words.", (), grades)
        return _Shown(self._show(kept), tuple(h.chunk_id for h in kept), grades)

    async def _searched_hits(self, query: str, k: int) -> list[Hit]:
        """The search's hits, through the rerank stage as the lookup's are."""
        vector = (await self._embedder.embed([query]))[0]
        rerank = self._rerank
        request = SearchRequest(
            tenant=self._tenant,
            text=query,
            vector=vector,
            k=rerank.stage.fetch_k(k),
            candidates=self._limits.candidates,
            fusion=self._limits.fusion,
            groups=self._groups,
        )
        fused = await self._retriever.search(request)
        call = RerankCall(self._tenant, query, fused, k, "agent", rerank.recorder, rerank.deadline)
        return await rerank.stage.rerank(call)

    def _relevant(self, query: str, hit: Hit) -> bool:
        if hit.dense_score is not None and hit.dense_score >= self._limits.min_similarity:
            return True
        wanted = content_words(query)
        found = content_words(f"{hit.title} {hit.section} {hit.text}")
        return bool(wanted) and len(wanted & found) / len(wanted) >= self._limits.min_word_overlap

    async def _read(self, shown: str) -> _Shown:
        doc_id = self._book.shown_document(shown)
        seen = None if doc_id is None else self._book.seen_positions(doc_id)
        if doc_id is None or seen is None:
            raise InvalidArguments("read takes a doc_id from this conversation's search results")
        chunks = await self._retriever.document_chunks(
            self._tenant, doc_id, MAX_DOCUMENT_CHUNKS, self._groups
        )
        unseen = [c for c in chunks if _position(c.chunk_id) not in seen]
        # Small-to-big: the passages nearest to those already shown come first.
        unseen.sort(key=lambda c: min(abs(_position(c.chunk_id) - p) for p in seen))
        picked = sorted(unseen[: self._limits.read_max_chunks], key=lambda c: _position(c.chunk_id))
        if not picked:
            return _Shown("Nothing more in this document: all of it is above.")
        return _Shown(self._show(picked), tuple(c.chunk_id for c in picked))

    def _show(self, hits: list[Hit]) -> str:
        parts = []
        for hit in hits:
            n, new = self._book.number(hit)
            tag = self._book.tag
            if not new:
                parts.append(shown_above(tag, n))
                continue
            parts.append(format_source(tag, n, hit, doc_id=True, max_chars=CHUNK_CHARS))
        return "\n\n".join(parts)


def _read_args(args: dict[str, Any]) -> str:
    _only(args, {"doc_id"})
    doc_id = args.get("doc_id")
    if not isinstance(doc_id, str) or not doc_id or len(doc_id) > MAX_DOC_ID_CHARS:
        raise InvalidArguments("read needs a string 'doc_id' from the search results")
    return doc_id


def _only(args: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(args) - allowed)
    if unknown:
        names = ", ".join(repr(u[:40]) for u in unknown[:5])
        raise InvalidArguments(
            f"unknown argument(s) {names}; allowed: {', '.join(sorted(allowed))}"
        )


def _failed(call: ToolCall, status: ToolStatus, message: str, started: float) -> ToolResult:
    return ToolResult(
        f"error: {message}", ToolRun(call.name, call.arguments, status, ms=_ms(started))
    )


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
