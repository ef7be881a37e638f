"""Extractive answers (no model): the relevance floor, chosen on the tuning split, and what the
answers quote, against the old answer (the first 300 characters of the top three passages).

    python bench/extractive_eval.py [--part tuning|heldout] [--limit N]

Corpus and index: bench/retrieval_eval.py's (the 10,033 Wikipedia lead sections in the
embedded index, its embeddings cache). Questions: FanOutQA dev leaf sub-questions, split by
`retrieval_eval.is_tuning` of the parent question, in two sets:
- answerable: the evidence page is in the corpus (`retrieval_eval.load_queries`);
- unanswerable: the evidence page is not in the corpus (the documents lack the page the
  question was written from; a related page may still hold the answer, so this set bounds
  from above how often an answer is honestly refused).

Each question runs as the lookup does with the default configuration: the query embedded
once, the hybrid search (k 6, 50 candidates, `minmax_peak`, the policy's lexical weight),
then `routers.extractive.Extractor.score` over the hits; the sentence vectors are cached on
disk like the chunks'. For each floor of `FLOORS`, `routers.extractive.answer_from` builds the
answer the gateway would give, and the report reads, per floor:

- kept: of the passages from the evidence page that hold the gold answer (its text, for
  answers of at most 60 characters), the share with a sentence that clears the floor, i.e.
  the share the floor would not silence;
- off-topic cited: of the passages the answers to answerable questions cite, the share not
  from the evidence page (another page may hold the answer too: an upper bound);
- refused: the share of questions answered "the documents did not give an answer"
  (answerable and unanswerable sets);
- answer in text: the share of questions with a gold answer whose answer text holds it;
- first on page: the share of answerable questions whose answer's first citation is the
  evidence page (the old answer's first citation was the search's top hit).

"kept" counts an answer-bearing evidence passage ranked below the `PASSAGES` an answer reads
as not kept, so below 1.0 even with no floor.

The floor chosen is the highest of `FLOORS` that keeps at least `KEEP_TARGET` of the
answer-bearing evidence passages on the tuning split; `RELEVANCE_FLOOR` in
routers/extractive.py is set from it by hand, and the held-out part is read with it once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder  # noqa: E402
from backends.retrieval.base import Hit, SearchRequest  # noqa: E402
from bench.retrieval_eval import (  # noqa: E402
    CACHE_DIR,
    TENANT,
    CachedEmbedder,
    Query,
    ensure_corpus,
    evidence_leaves,
    interval,
    is_tuning,
    load_queries,
    normalised,
    open_embedded,
    open_embedder,
)
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.settings import RetrievalConfig  # noqa: E402
from routers.extractive import (  # noqa: E402
    NO_ANSWER_TEXT,
    PASSAGES,
    RELEVANCE_FLOOR,
    Extractor,
    Scored,
    answer_from,
)
from routers.policy import lexical_reason  # noqa: E402
from scripts.train_router import fanoutqa_path  # noqa: E402

FLOORS = tuple(round(0.15 + 0.025 * i, 3) for i in range(19))  # 0.15 .. 0.60
KEEP_TARGET = 0.95
MAX_ANSWER_CHARS = 60
OLD_PASSAGES, OLD_CHARS = 3, 300
TIMED = 50


@dataclass(frozen=True, slots=True)
class Case:
    query: Query
    answers: tuple[str, ...]  # gold answers, normalised; empty when none is a short string
    answerable: bool  # the evidence page is in the corpus
    hits: tuple[Hit, ...]
    scored: Scored


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s.]", " ", text.casefold()).split())


def gold_answers(answer: Any) -> tuple[str, ...]:
    """The gold answer's short string forms (a number also with thousands separators)."""
    values = answer if isinstance(answer, list) else [answer]
    out: list[str] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        forms = [str(value)]
        if isinstance(value, int | float) and not isinstance(value, bool):
            forms.append(f"{value:,}")
        out += [norm(f) for f in forms if 0 < len(f) <= MAX_ANSWER_CHARS]
    return tuple(dict.fromkeys(f for f in out if f))


def fanout_leaves() -> dict[str, tuple[str | None, Any]]:
    """Normalised question text → (evidence page, gold answer), first occurrence."""
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    out: dict[str, tuple[str | None, Any]] = {}

    def walk(node: dict[str, Any]) -> None:
        for sub in node["decomposition"]:
            if not sub["decomposition"]:
                page = (sub.get("evidence") or {}).get("title")
                out.setdefault(normalised(sub["question"]), (page, sub.get("answer")))
            walk(sub)

    for parent in dev:
        walk(parent)
    return out


def unanswerable(corpus_ids: set[str]) -> list[Query]:
    """Leaf sub-questions whose evidence page is not in the corpus, first occurrence."""
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    queries: dict[str, Query] = {}
    for parent in sorted(dev, key=lambda p: str(p["id"])):
        for question, page in evidence_leaves(parent):
            if page is not None and page not in corpus_ids:
                queries.setdefault(normalised(question), Query(question, page, parent["id"]))
    return list(queries.values())


async def run_cases(
    queries: Sequence[Query], answerable: bool, embedder: CachedEmbedder, extractor: Extractor
) -> list[Case]:
    config = RetrievalConfig()
    leaves = fanout_leaves()
    retriever = open_embedded()
    vectors = await embedder.embed([q.text for q in queries])
    cases = []
    try:
        for query, vector in zip(queries, vectors, strict=True):
            lexical = config.lexical_weight
            if lexical_reason(query.text):
                lexical = max(lexical, config.identifier_lexical_weight)
            hits = await retriever.search(
                SearchRequest(
                    tenant=TENANT,
                    text=query.text,
                    vector=vector,
                    k=config.k,
                    candidates=config.candidates,
                    lexical_weight=lexical,
                    dense_weight=config.dense_weight,
                    fusion=config.fusion,
                )
            )
            scored = await extractor.score(query.text, vector, hits)
            _, answer = leaves.get(normalised(query.text), (None, None))
            cases.append(Case(query, gold_answers(answer), answerable, tuple(hits), scored))
    finally:
        await retriever.aclose()
    return cases


def holds(text: str, answers: Sequence[str]) -> bool:
    flat = norm(text)
    return any(a in flat for a in answers)


def old_text(hits: Sequence[Hit]) -> str:
    return " ".join(h.text[:OLD_CHARS] for h in hits[:OLD_PASSAGES])


@dataclass(frozen=True, slots=True)
class Reading:
    floor: float
    kept: float
    off_topic: float
    refused_answerable: float
    refused_unanswerable: float
    answer_in_text: float
    first_on_page: float
    chars: float


def read_floor(cases: Sequence[Case], floor: float, count: Any) -> Reading:
    bearing_kept = bearing = cited = off = 0
    refused = {True: 0, False: 0}
    totals = {True: 0, False: 0}
    found = with_gold = first_on_page = 0
    chars: list[int] = []
    for case in cases:
        answer = answer_from(case.scored, case.hits, count, None, floor)
        totals[case.answerable] += 1
        if answer.text == NO_ANSWER_TEXT:
            refused[case.answerable] += 1
        else:
            chars.append(len(answer.text))
        if not case.answerable:
            continue
        first_on_page += bool(answer.citations) and answer.citations[0].doc_id == case.query.page
        for c in answer.citations:
            cited += 1
            off += c.doc_id != case.query.page
        clearing = {c.passage for c in case.scored.candidates if c.clears(floor)}
        for i, hit in enumerate(case.hits):
            if hit.doc_id == case.query.page and case.answers and holds(hit.text, case.answers):
                bearing += 1
                bearing_kept += i in clearing
        if case.answers:
            with_gold += 1
            found += holds(answer.text, case.answers)
    return Reading(
        floor,
        bearing_kept / max(bearing, 1),
        off / max(cited, 1),
        refused[True] / max(totals[True], 1),
        refused[False] / max(totals[False], 1),
        found / max(with_gold, 1),
        first_on_page / max(totals[True], 1),
        float(np.mean(chars)) if chars else 0.0,
    )


def report_old(cases: Sequence[Case]) -> str:
    gold = [c for c in cases if c.answerable and c.answers]
    found = sum(holds(old_text(c.hits), c.answers) for c in gold)
    answerable = [c for c in cases if c.answerable]
    off = sum(h.doc_id != c.query.page for c in answerable for h in c.hits[:OLD_PASSAGES])
    cited = sum(len(c.hits[:OLD_PASSAGES]) for c in answerable)
    chars = np.mean([len(old_text(c.hits)) for c in cases if c.hits])
    first = sum(bool(c.hits) and c.hits[0].doc_id == c.query.page for c in answerable)
    return (
        f"old answer (top {OLD_PASSAGES} passages, first {OLD_CHARS} chars each): answer in "
        f"text {found / max(len(gold), 1):.3f} (n {len(gold)}), off-topic cited "
        f"{off / max(cited, 1):.3f}, first citation on the page {first / len(answerable):.3f} "
        f"(n {len(answerable)}), refused 0.000, mean {chars:.0f} chars"
    )


def answer_interval(cases: Sequence[Case], floor: float, count: Any) -> str:
    gold = [c for c in cases if c.answerable and c.answers]
    values = np.array(
        [holds(answer_from(c.scored, c.hits, count, None, floor).text, c.answers) for c in gold],
        dtype=np.float64,
    )
    old = np.array([holds(old_text(c.hits), c.answers) for c in gold], dtype=np.float64)
    reachable = [
        i for i, c in enumerate(gold) if any(holds(h.text, c.answers) for h in c.hits[:PASSAGES])
    ]
    groups = [c.query.parent for c in gold]
    lo, hi = interval(values, groups)
    olo, ohi = interval(old, groups)
    return (
        f"answer in text at floor {floor:.3f}: {values.mean():.3f} [{lo:.3f}, {hi:.3f}] vs old "
        f"{old.mean():.3f} [{olo:.3f}, {ohi:.3f}] (n {len(gold)}, 95% bootstrap by parent); "
        f"the gold answer is in the top {PASSAGES} passages for {len(reachable)}, and the "
        f"answer holds it for {int(values[reachable].sum())} of those"
    )


async def timing(cases: Sequence[Case], extractor: Extractor, embedder: CachedEmbedder) -> str:
    """What the extractive step costs a request: `Extractor.score` with the sentences embedded
    afresh (no cache), on the first `TIMED` questions."""
    chosen = [c for c in cases if c.hits][:TIMED]
    vectors = await embedder.embed([c.query.text for c in chosen])
    took, counts = [], []
    for case, vector in zip(chosen, vectors, strict=True):
        start = time.perf_counter()
        scored = await extractor.score(case.query.text, vector, case.hits)
        took.append((time.perf_counter() - start) * 1000)
        counts.append(len(scored.candidates))
    p50, p95 = np.percentile(took, [50, 95])
    return (
        f"extractive step, sentences embedded afresh: p50 {p50:.0f} ms, p95 {p95:.0f} ms, "
        f"{np.mean(counts):.1f} sentences a question (n {len(chosen)})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("tuning", "heldout"), default="tuning")
    parser.add_argument("--limit", type=int, default=None, help="questions per set")
    parser.add_argument("--timing", action="store_true", help=f"time {TIMED} questions afresh")
    args = parser.parse_args()
    tuning = args.part == "tuning"
    docs = load_wiki_sample()
    corpus_ids = {d.doc_id for d in docs}
    embedder = open_embedder()
    sentences = CachedEmbedder(OnnxMiniLMEmbedder(), CACHE_DIR / "extractive_sentences.npz")
    try:
        index = open_embedded()
        try:
            print(await ensure_corpus("embedded", index, docs, embedder), file=sys.stderr)
        finally:
            await index.aclose()
        extractor = Extractor(sentences)
        sets = {True: load_queries(corpus_ids), False: unanswerable(corpus_ids)}
        cases: list[Case] = []
        for answerable, queries in sets.items():
            chosen = [q for q in queries if is_tuning(q.parent) == tuning][: args.limit]
            print(f"{args.part}: {len(chosen)} questions, answerable={answerable}", flush=True)
            cases += await run_cases(chosen, answerable, embedder, extractor)
        if args.timing:
            fresh = OnnxMiniLMEmbedder()
            try:
                print(await timing(cases, Extractor(fresh), embedder))
            finally:
                await fresh.aclose()
    finally:
        sentences.save()
        await embedder.aclose()
    count = extractor.count
    print(report_old(cases))
    print(
        "floor   kept   off-topic cited   refused (answerable / not)   answer in text   "
        "first on page   chars"
    )
    readings = [read_floor(cases, floor, count) for floor in FLOORS]
    for r in readings:
        print(
            f"{r.floor:.3f}   {r.kept:.3f}   {r.off_topic:.3f}             "
            f"{r.refused_answerable:.3f} / {r.refused_unanswerable:.3f}                "
            f"{r.answer_in_text:.3f}            {r.first_on_page:.3f}           {r.chars:.0f}"
        )
    if tuning:
        chosen_floor = max((r.floor for r in readings if r.kept >= KEEP_TARGET), default=FLOORS[0])
        print(f"chosen floor (highest keeping >= {KEEP_TARGET:.2f}): {chosen_floor:.3f}")
    print(f"RELEVANCE_FLOOR in routers/extractive.py: {RELEVANCE_FLOOR:.3f}")
    print(answer_interval(cases, RELEVANCE_FLOOR, count))


if __name__ == "__main__":
    asyncio.run(main())
