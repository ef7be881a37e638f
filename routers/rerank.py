"""The rerank stage: whether a fused ranking is worth a second stage, and running it.

Reranking is a decision, like routing: a cross-encoder reads the query with every candidate,
which costs a forward pass (or a paid API call) per passage, so it runs only where the fused
ranking is uncertain. The lookup and the agent's `search` tool both call `RerankStage.rerank`
between the search and what reads its hits (the sufficiency grade, the agent's relevance grade),
so both follow one policy (`retrieval.rerank`):

- off, or fewer than two hits: nothing to reorder;
- `when: uncertain` (the default): skipped where the top fused hit stands out, ahead of the next
  document's best hit by more than `max_margin` of its own fused score, (s1 - s2) / s1, or
  ranked first by both arms when `skip_when_arms_agree`; and skipped for keyword and identifier
  queries (`skip_keyword_queries`, `routers.policy.lexical_reason`), where BM25 already ranks
  well and the cross-encoder ranks worse; `when: always`: every time;
- otherwise the top `candidates` fused hits, each cut at `passage_chars`, are scored and
  reordered by minmax(reranker) + `blend` x minmax(fused) + `title_weight` x named over them
  (ties keep the fused order), the rest follow in fused order, and `k` are kept; named is 1 for
  a hit whose title the query names (`routers.titles`), 0 otherwise, and 0 for every hit of a
  keyword or identifier query;
- a search skipped as confident is still reordered by minmax(fused) + `title_weight` x named
  over its top `candidates` when the query names one of their titles: a string match, no
  reranker call;
- either reorder keeps the fused first hit first when it holds every content word of a query
  of at least `full_match_min_words` of them (its title counted) and the hit put above it does
  not (`keep_full_match`). Both signals above read names: the cross-encoder was trained on
  questions that name their page, and the title term lifts a named page. A question that
  describes what it wants ("Which coastal city in southeastern Kenya along the Indian Ocean?")
  names other pages, and on such questions both moved a page that holds part of the description
  above the one passage that holds all of it (docs/reranking.md, "The coverage guard"). A short
  question ("What is the population of Indonesia?") is matched whole by many passages by chance
  (a city's page that gives the country's population), so the guard waits for four words.

The defaults are the policy chosen on the tuning split by bench/rerank_eval.py for the local
reranker (docs/reranking.md, "The coverage guard").

A reranker that fails or outlives `timeout_s` (or the request's deadline) leaves the fused order
as it was: the decision says "failed" and the request's notes say so. Every decision is handed
to the request's `RerankRecorder` (the gateway's: timings, metrics, `debug`, the tenant's cost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, Field, model_validator

from backends.errors import BackendError, UpstreamError
from backends.rerank.base import Reranker, RerankRequest
from backends.rerank.config import OpenSearchRerankConfig, RemoteRerankConfig
from backends.retrieval.base import Hit
from backends.sections import SECTION
from routers.grading import content_words
from routers.policy import lexical_reason
from routers.titles import names_title

log = logging.getLogger(__name__)

# What the stage decided for one search (a metric label and a `debug` field).
RerankDecision = Literal[
    "reranked", "skipped_off", "skipped_few", "skipped_confident", "skipped_keywords", "failed"
]
# Which search it was: the lookup's, or one of the agent's `search` tool.
RerankSite = Literal["lookup", "agent"]


class RerankConfig(BaseModel):
    """`retrieval.rerank`: which reranker, its settings, and when a query pays for it."""

    model_config = SECTION

    # The local cross-encoder by default: it costs nothing where the policy skips (most
    # searches) and lifts the first citation where it reranks (docs/reranking.md).
    reranker: Literal["off", "local", "remote", "opensearch"] = "local"
    remote: RemoteRerankConfig | None = None
    opensearch: OpenSearchRerankConfig | None = None
    # "uncertain": only where the fused ranking is (below); "always": every search.
    when: Literal["uncertain", "always"] = "uncertain"
    # Reranked only when the best two documents' fused scores are at most this far apart, as a
    # share of the best one's: (s1 - s2) / s1.
    max_margin: float = Field(default=0.1, ge=0, le=1)
    # Skipped when both arms rank the same passage first.
    skip_when_arms_agree: bool = False
    # Keyword and identifier queries keep the fused order: on the lexical benchmark the local
    # cross-encoder alone ranks far below fusion, and reranking them loses R@1.
    skip_keyword_queries: bool = True
    # The final order: minmax(reranker scores) + blend x minmax(fused scores), over the
    # candidates; 0 orders by the reranker alone.
    blend: float = Field(default=1.0, ge=0, le=10)
    # What a hit whose title the query names adds to its final score (both terms above are in
    # [0, 1]), reranked or skipped as confident; never for keyword or identifier queries, where
    # it lost on the lexical benchmark. 0: titles are not read.
    title_weight: float = Field(default=0.5, ge=0, le=10)
    # A fused first hit holding every content word of the query stays first unless the hit
    # put above it holds them all too (the module docstring); only for queries of at least
    # `full_match_min_words` content words.
    keep_full_match: bool = True
    full_match_min_words: int = Field(default=4, ge=1, le=100)
    # How many of the top fused hits are scored (the lookup fetches this many, keeps `k`).
    candidates: int = Field(default=10, ge=2, le=100)
    # Each passage is cut at this many characters (~4 a token: 1024 ~ 256) before the reranker
    # reads it; the local one also cuts at the word pieces it was trained on.
    passage_chars: int = Field(default=1024, ge=64, le=8192)
    # The reranker's whole call, retries included; past it the fused order stands.
    timeout_s: float = Field(default=1.0, gt=0, le=30)

    @model_validator(mode="after")
    def _settings_of_the_reranker(self) -> RerankConfig:
        if self.reranker == "remote" and self.remote is None:
            raise ValueError("reranker 'remote' needs a 'remote' section (model, api_base, ...)")
        if self.reranker == "opensearch" and self.opensearch is None:
            raise ValueError("reranker 'opensearch' needs an 'opensearch' section (model_id)")
        return self


@dataclass(frozen=True, slots=True)
class RerankTrace:
    """One search's rerank decision, as `debug` shows it."""

    site: RerankSite
    decision: RerankDecision
    reranker: str  # its kind, or "off"
    model: str
    # The top two fused scores' gap as a share of the best possible (None: under two hits).
    margin: float | None
    # Passages sent to the reranker (0: none was), and how long its call took.
    candidates: int = 0
    ms: float = 0.0
    # The kept hits' fused ranks (1-based) in their new order; empty when nothing moved.
    fused_ranks: tuple[int, ...] = ()
    # The coverage guard put the fused first hit back first (`keep_full_match`).
    full_match_kept: bool = False
    # Why it failed (the reranker's error), for the notes and the log.
    detail: str = ""

    @property
    def called(self) -> bool:
        return self.candidates > 0


class RerankRecorder(Protocol):
    """What a request keeps of its rerank decisions (the gateway's: timings, metrics, debug)."""

    def record(self, trace: RerankTrace) -> None: ...

    def spend(self, usd: float) -> None:
        """A paid reranker call's price, charged to the request's tenant."""
        ...


@dataclass(frozen=True, slots=True)
class RerankCall:
    """One search's hits to rerank, and for whom."""

    tenant: str
    query: str
    hits: Sequence[Hit]
    k: int  # hits to keep
    site: RerankSite
    recorder: RerankRecorder | None = None
    deadline: float | None = None  # the request's, a `time.monotonic()` instant


def fused_margin(hits: Sequence[Hit]) -> float | None:
    """(s1 - s2) / s1 over the best fused hit of the two best documents; None: fewer than two
    documents, or no positive score."""
    best: dict[str, float] = {}
    for h in hits:
        best.setdefault(h.doc_id, h.score)
    top = sorted(best.values(), reverse=True)[:2]
    if len(top) < 2 or top[0] <= 0:
        return None
    return max(0.0, (top[0] - top[1]) / top[0])


def rerank_passage(hit: Hit, chars: int, titled: bool = True) -> str:
    """What the reranker reads of a hit: its title (when `titled`), then its text, cut at
    `chars`. The local reranker reads the text alone, as it was trained."""
    text = f"{hit.title}: {hit.text}" if hit.title and titled else hit.text
    return text[:chars]


def blended(scores: Sequence[float], fused: Sequence[float], blend: float) -> list[float]:
    """minmax(scores) + blend x minmax(fused): the reranker's order, the fusion's as a weight."""
    return [r + blend * f for r, f in zip(_minmax(scores), _minmax(fused), strict=True)]


def title_matches(query: str, titles: Sequence[str]) -> list[bool]:
    """Per title, whether the query names it; none for a keyword or identifier query."""
    if lexical_reason(query):
        return [False] * len(titles)
    return [names_title(query, t) for t in titles]


def final_order(base: Sequence[float], named: Sequence[bool], title_weight: float) -> list[int]:
    """Indices by base score + title_weight for a named hit, best first; ties keep the order."""
    final = [b + (title_weight if n else 0.0) for b, n in zip(base, named, strict=True)]
    return sorted(range(len(final)), key=lambda i: (-final[i], i))


def full_match_first(
    query: str, passages: Sequence[str], order: list[int], min_words: int
) -> list[int]:
    """`order` (indices into `passages`, each a fused hit's title and text, fused first first)
    with the fused first put back first when it holds every content word of a query of at
    least `min_words` of them and the passage `order` puts first does not hold them all."""
    if not order or order[0] == 0:
        return order
    words = content_words(query)
    if len(words) < min_words or not words <= content_words(passages[0]):
        return order
    if words <= content_words(passages[order[0]]):
        return order
    return [0, *(i for i in order if i != 0)]


def _minmax(values: Sequence[float]) -> list[float]:
    low, high = min(values), max(values)
    span = high - low
    return [(v - low) / span if span > 0 else 1.0 for v in values]


class RerankStage:
    def __init__(self, config: RerankConfig, reranker: Reranker | None) -> None:
        """`reranker` None (or `config.reranker` off): every search is "skipped_off"."""
        self._config = config
        self._reranker = reranker if config.reranker != "off" else None

    @property
    def enabled(self) -> bool:
        return self._reranker is not None

    def fetch_k(self, k: int) -> int:
        """How many hits a search should return for `k` to be kept after this stage."""
        return max(k, self._config.candidates) if self._reranker is not None else k

    def decide(
        self, hits: Sequence[Hit], margin: float | None, query: str = ""
    ) -> RerankDecision | None:
        """The decision for these fused hits; None: rerank them."""
        c = self._config
        if self._reranker is None:
            return "skipped_off"
        if len(hits) < 2:
            return "skipped_few"
        if c.when == "always":
            return None
        top = hits[0]
        if c.skip_when_arms_agree and top.bm25_rank == 1 and top.dense_rank == 1:
            return "skipped_confident"
        if margin is not None and margin > c.max_margin:
            return "skipped_confident"
        if c.skip_keyword_queries and lexical_reason(query):
            return "skipped_keywords"
        return None

    async def rerank(self, call: RerankCall) -> list[Hit]:
        """The hits to keep, reranked when the policy says so; the decision is recorded."""
        margin = fused_margin(call.hits)
        decision = self.decide(call.hits, margin, call.query)
        reranker = self._reranker
        c = self._config
        head = list(call.hits[: c.candidates])
        fused = [h.score for h in head]
        reads_titles = c.title_weight > 0 and decision in (None, "skipped_confident")
        named = title_matches(call.query, [h.title for h in head]) if reads_titles else []
        if decision == "skipped_confident" and any(named):
            order = final_order(_minmax(fused), named, c.title_weight)
            guarded = self._guarded(call.query, head, order)
            kept, moved = self._reordered(call, head, guarded)
            trace = self._trace(
                call, decision, margin, fused_ranks=moved, full_match_kept=guarded != order
            )
            self._record(call, trace)
            return kept
        if decision is not None or reranker is None:
            self._record(call, self._trace(call, decision or "skipped_off", margin))
            return list(call.hits[: call.k])
        titled = reranker.kind != "local"
        passages = [rerank_passage(h, c.passage_chars, titled) for h in head]
        started = time.perf_counter()
        scores = await self._scores_or_none(reranker, call, passages, margin, started)
        if scores is None:
            return list(call.hits[: call.k])
        order = final_order(
            blended(scores, fused, c.blend), named or [False] * len(head), c.title_weight
        )
        guarded = self._guarded(call.query, head, order)
        kept, moved = self._reordered(call, head, guarded)
        trace = self._trace(
            call, "reranked", margin, len(head), started, moved, full_match_kept=guarded != order
        )
        self._record(call, trace)
        return kept

    def _guarded(self, query: str, head: Sequence[Hit], order: list[int]) -> list[int]:
        c = self._config
        if not c.keep_full_match or not order or order[0] == 0:
            return order
        passages = [f"{h.title} {h.text}" for h in head]
        return full_match_first(query, passages, order, c.full_match_min_words)

    @staticmethod
    def _reordered(
        call: RerankCall, head: list[Hit], order: list[int]
    ) -> tuple[list[Hit], tuple[int, ...]]:
        """The `k` hits to keep, the head in `order` then the rest in fused order, and their
        fused ranks (1-based) in that order, empty when none moved."""
        kept = ([head[i] for i in order] + list(call.hits[len(head) :]))[: call.k]
        rest = range(len(head) + 1, len(call.hits) + 1)
        ranks = (*(i + 1 for i in order), *rest)[: call.k]
        return kept, ranks if ranks != tuple(range(1, len(ranks) + 1)) else ()

    async def _scores_or_none(
        self,
        reranker: Reranker,
        call: RerankCall,
        passages: list[str],
        margin: float | None,
        started: float,
    ) -> list[float] | None:
        """The scores, or None with the failure recorded."""
        try:
            return await self._scores(reranker, call, passages)
        except (BackendError, TimeoutError) as exc:
            detail = str(exc) or "no answer within its timeout"
            log.warning("rerank failed", extra={"error": detail, "site": call.site})
            trace = self._trace(call, "failed", margin, len(passages), started, detail=detail)
            self._record(call, trace)
            return None

    async def _scores(
        self, reranker: Reranker, call: RerankCall, passages: list[str]
    ) -> list[float]:
        deadline = time.monotonic() + self._config.timeout_s
        if call.deadline is not None:
            deadline = min(deadline, call.deadline)
        spend = call.recorder.spend if call.recorder is not None else None
        request = RerankRequest(call.tenant, call.query, passages, deadline, on_cost=spend)
        # The reranker ends by the deadline itself; this bounds one that does not.
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
            scores = await reranker.scores(request)
        if len(scores) != len(passages):
            detail = f"{reranker.model_id}: {len(scores)} scores for {len(passages)} passages"
            raise UpstreamError("rerank", detail)
        return scores

    def _trace(
        self,
        call: RerankCall,
        decision: RerankDecision,
        margin: float | None,
        candidates: int = 0,
        started: float | None = None,
        fused_ranks: tuple[int, ...] = (),
        detail: str = "",
        full_match_kept: bool = False,
    ) -> RerankTrace:
        reranker = self._reranker
        ms = 0.0 if started is None else round((time.perf_counter() - started) * 1000, 3)
        return RerankTrace(
            site=call.site,
            decision=decision,
            reranker=reranker.kind if reranker is not None else "off",
            model=reranker.model_id if reranker is not None else "",
            margin=None if margin is None else round(margin, 4),
            candidates=candidates,
            ms=ms,
            fused_ranks=fused_ranks,
            full_match_kept=full_match_kept,
            detail=detail,
        )

    @staticmethod
    def _record(call: RerankCall, trace: RerankTrace) -> None:
        if call.recorder is not None:
            call.recorder.record(trace)


# The stage of a deployment (or an evaluation) with no reranker: every search "skipped_off".
RERANK_OFF = RerankStage(RerankConfig(reranker="off"), None)


def failure_notes(traces: Sequence[RerankTrace]) -> tuple[str, ...]:
    """What a request's answer says of the reranks that failed (the fused order was kept)."""
    return tuple(
        f"rerank failed ({t.site}: {t.detail}); the fused order was kept"
        for t in traces
        if t.decision == "failed"
    )
