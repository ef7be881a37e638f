"""Multi-hop evaluation: always-lookup, always-multihop and adaptive routing on FanOutQA dev,
through the gateway's own executors, in one run.

    python bench/multihop_eval.py [--limit N] [--parts test] [--max-steps 4 ...]
    python bench/multihop_eval.py --model openai/gpt-4o --api-key-env OPENAI_API_KEY

Data: the held-out parts of the dev split made by `scripts/train_router.py` (by parent id;
default the test part, the one neither the router nor the sufficiency model was fitted or tuned
on; `--parts val test` adds val, where adaptive routing is in-sample). Multi-hop questions are
the parents; their evidence is the leaf sub-questions' evidence pages that the 10,033-page
Wikipedia sample holds (the embedded index `bench/retrieval_eval.py` builds and caches), and only
parents with at least one such page are reported. Single-hop questions are the held-out leaf
sub-questions whose page the corpus holds. The FanOutQA test file is never read.

Without `--model` the large tier is a `ScriptedPlanner` (in-process, no network): turn 1 runs
one `search` per gold leaf sub-question, all in one turn (so they run concurrently); turn 2
`read`s the top document of each search that showed fewer than `--thin-below` passages; then it
answers citing every source number it was shown. The gold decomposition is an upper bound on
planning: the figures say what the loop, the tools, relevance grading and the caps do with good
plans, not how well a model plans. The small tier (lookup, direct) answers the same way, citing
every source. Tokens are estimated as characters / 4 of everything sent (each call re-sends the
conversation and the tool specs) and of what comes back, priced per tier.

With `--model` (any litellm model string; `--api-base`, `--api-key-env`, `--small-model`) the
same harness runs the real model through `backends.llm.tiers.LiteLLMTiers`, the
gateway's own LLM seam, and also reports answer quality against the FanOutQA dev answers: the
share of gold answer strings found in the answer (FanOutQA's "loose accuracy", normalised by
case, number commas, punctuation and spacing but not lemmatised) and token F1. Tokens and cost
are then the upstream's. The relevance-threshold sweep is skipped unless `--sweep` is given.

Metrics per question, averaged over questions: evidence recall = share of the question's evidence
pages among the documents of (a) every chunk shown to the model ("shown": the lookup's k hits,
or every passage the agent's tools returned after grading) and (b) the chunks its answer cites;
95% intervals bootstrap whole parents (route_eval's seed). Latency per step is the wall time of
one model turn plus the tools it asked for (the first step also holds the lookup's retrieval;
search turns and answer turns are pooled, and a scripted turn's model time is ~0);
query embeddings are computed once up front and cached, so a search here costs a cache read
where the gateway runs MiniLM once per search. Grading: each agent search's hits kept or dropped
by the tools' relevance grade, split by whether the hit's page is evidence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

# Before numpy loads OpenBLAS (see bench/retrieval_eval.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.base import Embedder  # noqa: E402
from backends.llm.base import (  # noqa: E402
    LLM,
    Completion,
    LLMCall,
    Message,
    StreamDelta,
    Tier,
    TierConfig,
    ToolCall,
    Usage,
)
from backends.llm.tiers import LiteLLMTiers  # noqa: E402
from backends.retrieval.base import Hit, Retriever, SearchRequest, Vector  # noqa: E402
from bench.retrieval_eval import (  # noqa: E402
    TENANT,
    ensure_corpus,
    evidence_page,
    leaf_nodes,
    normalised,
    open_embedded,
    open_embedder,
)
from bench.route_eval import bootstrap  # noqa: E402
from bench.route_eval import parse_args as route_eval_args  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.settings import ModelsConfig, RetrievalConfig  # noqa: E402
from routers.agent import AgentDeps  # noqa: E402
from routers.agent_caps import AgentConfig  # noqa: E402
from routers.executors import Executor, RegistryConfig, build_registry  # noqa: E402
from routers.generation import NOT_FOUND, finish, usage_total  # noqa: E402
from routers.learned import LearnedClassifier  # noqa: E402
from routers.lookup import LookupParams  # noqa: E402
from routers.policy import PolicyConfig, decide  # noqa: E402
from routers.rules import EscalationConfig  # noqa: E402
from routers.sufficiency import use_model  # noqa: E402
from routers.types import Answer, Citation, Escalation, Generation, Route, RouteContext  # noqa: E402
from scripts.train_router import fanoutqa_path, load_examples  # noqa: E402

F64 = npt.NDArray[np.float64]
CHARS_PER_TOKEN = 4
PLANNER_MODEL = "scripted-planner"
# Relevance thresholds of the sweep: -1 keeps every hit (no grading), then around the default.
SWEEP = (-1.0, 0.2, 0.3, 0.4, 0.5)
# What each strategy asks the policy for: a forced route, or the router's own decision.
STRATEGIES = {"always-lookup": "lookup", "always-multihop": "multihop", "adaptive": "auto"}
MULTI_HOP, SINGLE_HOP = "multi-hop", "single-hop"
# Single-hop traffic: what adaptive routing costs it against always-lookup.
SINGLE_HOP_STRATEGIES = ("always-lookup", "adaptive")


# -- questions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    group: str  # the FanOutQA parent id: the bootstrap resamples whole parents
    plan: tuple[str, ...]  # the gold leaf sub-questions: the scripted planner's searches
    evidence: frozenset[str]  # evidence pages the corpus holds (doc id = page title)
    answer: Any  # the FanOutQA gold answer: a string, number, list or dict


def parent_question(parent: dict[str, Any], corpus: set[str]) -> Question:
    leaves = list(leaf_nodes(parent))
    plan = tuple(dict.fromkeys(leaf["question"].strip() for leaf in leaves))
    pages = {evidence_page(leaf) for leaf in leaves}
    evidence = frozenset(p for p in pages if p is not None and p in corpus)
    return Question(parent["question"].strip(), parent["id"], plan, evidence, parent["answer"])


def load_questions(
    parts: Sequence[str], corpus: set[str]
) -> tuple[list[Question], list[Question], int]:
    """Held-out parents with evidence in the corpus, held-out single-hop leaves whose page the
    corpus holds, and how many held-out parents had no evidence page in it."""
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    by_id = {p["id"]: p for p in dev}
    leaf_of: dict[str, dict[str, Any]] = {}
    for parent in dev:
        for leaf in leaf_nodes(parent):
            leaf_of.setdefault(normalised(leaf["question"]), leaf)
    held_out = [e for e in load_examples() if e.split in parts]
    parents = [
        parent_question(by_id[e.group], corpus) for e in held_out if e.route is Route.MULTIHOP
    ]
    leaves = []
    for example in (e for e in held_out if e.route is Route.LOOKUP):
        leaf = leaf_of[normalised(example.text)]
        page = evidence_page(leaf)
        if page in corpus:
            plan = (example.text,)
            leaves.append(
                Question(example.text, example.group, plan, frozenset({page}), leaf["answer"])
            )
    answerable = [p for p in parents if p.evidence]
    return answerable, leaves, len(parents) - len(answerable)


# -- the scripted planner and the instrumented seams -----------------------------------------


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per token, per tier."""

    small: tuple[float, float]  # (prompt, completion)
    large: tuple[float, float]

    def of(self, tier: Tier) -> tuple[float, float]:
        return self.small if tier == "small" else self.large

    def usage(self, tier: Tier, prompt_chars: int, completion_chars: int) -> Usage:
        prompt, completion = estimate_tokens(prompt_chars), estimate_tokens(completion_chars)
        price_in, price_out = self.of(tier)
        return Usage(prompt, completion, prompt * price_in + completion * price_out)


def estimate_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


# A passage as the tools and the lookup prompt issue it (routers.prompts.format_source).
_SOURCE = re.compile(r'^<source id="([^"\s]+-\d+)"', re.MULTILINE)
_SHOWN_DOC = re.compile(r'^<source id="[^"]*" doc_id="([^"]*)"', re.MULTILINE)


def _chars(messages: Sequence[Message]) -> int:
    return sum(len(m.content) + sum(_call_chars(c) for c in m.tool_calls) for m in messages)


def _call_chars(call: ToolCall) -> int:
    return len(call.name) + len(json.dumps(call.arguments))


class ScriptedPlanner:
    """An `LLM` that plans with a question's gold decomposition: searches, reads, answers."""

    def __init__(self, plan: Sequence[str], prices: Prices, *, thin_below: int = 2) -> None:
        self._plan = tuple(plan)
        self._prices = prices
        self._thin_below = thin_below

    def has_tier(self, tier: Tier) -> bool:
        return True

    def prices(self, tier: Tier) -> tuple[float, float]:
        """USD per (prompt, completion) token: what a loop that projects its cost reads."""
        return self._prices.of(tier)

    async def complete(self, call: LLMCall) -> Completion:
        # a planned answer takes no parameters: `call.options` is not read
        tier, messages, tools = call.tier, call.messages, call.tools
        calls = self._tool_calls(messages) if tools else ()
        text = "" if calls else answer_citing_all(messages)
        prompt_chars = _chars(messages) + (len(json.dumps(tools)) if tools else 0)
        usage = self._prices.usage(tier, prompt_chars, len(text) + sum(map(_call_chars, calls)))
        return Completion(text, tier, PLANNER_MODEL, usage, calls)

    def _tool_calls(self, messages: Sequence[Message]) -> tuple[ToolCall, ...]:
        turns = sum(1 for m in messages if m.role == "assistant" and m.tool_calls)
        if turns == 0:
            return tuple(
                ToolCall(f"search-{i}", "search", {"query": q}) for i, q in enumerate(self._plan)
            )
        return self._reads(messages) if turns == 1 else ()

    def _reads(self, messages: Sequence[Message]) -> tuple[ToolCall, ...]:
        """A read of the top document of each search that showed fewer passages than wanted."""
        thin: dict[str, None] = {}
        for message in messages:
            if message.role != "tool" or not (message.tool_call_id or "").startswith("search-"):
                continue
            shown = _SOURCE.findall(message.content)
            docs = _SHOWN_DOC.findall(message.content)
            if 0 < len(shown) < self._thin_below and docs:
                thin.setdefault(docs[0])
        return tuple(ToolCall(f"read-{i}", "read", {"doc_id": d}) for i, d in enumerate(thin))

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        completion = await self.complete(call)
        yield StreamDelta(completion.text, done=True, usage=completion.usage, model=PLANNER_MODEL)

    async def warm_up(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def answer_citing_all(messages: Sequence[Message]) -> str:
    """An answer citing every source issued in the prompt or the tool results."""
    markers = {
        marker: None
        for m in messages
        if m.role in ("system", "tool")
        for marker in _SOURCE.findall(m.content)
    }
    if not markers:
        return NOT_FOUND
    return "From the passages: " + "".join(f"[{marker}]" for marker in markers)


class TimedLLM:
    """Any `LLM`, with the start of every call recorded: the steps' boundaries."""

    def __init__(self, inner: LLM) -> None:
        self._inner = inner
        self.starts: list[float] = []

    def has_tier(self, tier: Tier) -> bool:
        return self._inner.has_tier(tier)

    async def complete(self, call: LLMCall) -> Completion:
        self.starts.append(time.perf_counter())
        return await self._inner.complete(call)

    def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        self.starts.append(time.perf_counter())
        return self._inner.stream(call)

    async def warm_up(self) -> None:
        await self._inner.warm_up()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __getattr__(self, name: str) -> Any:
        # Whatever else the seam offers (its prices, say) is the inner model's, untimed.
        return getattr(self._inner, name)


class RecordingRetriever:
    """The index, remembering each search's hits (to judge what grading dropped) and every
    chunk's document. Writes and the rest pass through untouched."""

    def __init__(self, inner: Retriever) -> None:
        self.name = inner.name
        self._inner = inner
        self.searches: dict[str, list[Hit]] = {}
        self.doc_of: dict[str, str] = {}

    async def search(self, request: SearchRequest) -> list[Hit]:
        hits = await self._inner.search(request)
        self.searches[request.text] = hits
        self.doc_of.update((h.chunk_id, h.doc_id) for h in hits)
        return hits

    async def document_chunks(self, tenant: str, doc_id: str, limit: int = 50) -> list[Hit]:
        hits = await self._inner.document_chunks(tenant, doc_id, limit)
        self.doc_of.update((h.chunk_id, h.doc_id) for h in hits)
        return hits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# -- one question through the executors ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grading:
    """Hits of the agent's searches, kept or dropped by relevance, by evidence or not."""

    kept_evidence: int = 0
    dropped_evidence: int = 0
    kept_other: int = 0
    dropped_other: int = 0

    def __add__(self, other: Grading) -> Grading:
        return Grading(
            self.kept_evidence + other.kept_evidence,
            self.dropped_evidence + other.dropped_evidence,
            self.kept_other + other.kept_other,
            self.dropped_other + other.dropped_other,
        )


@dataclass(frozen=True, slots=True)
class Run:
    question: Question
    route: Route  # the route that wrote the answer
    escalated: bool
    shown: frozenset[str]  # documents of every chunk the model was shown
    cited: frozenset[str]
    model_calls: int
    agent_steps: int
    tool_calls: int  # run, not refused at the cap
    usage: Usage
    step_ms: tuple[float, ...]
    total_ms: float
    cap: str | None
    grading: Grading
    text: str


def evidence_recall(evidence: frozenset[str], found: Iterable[str]) -> float:
    """Share of the evidence pages among the documents found."""
    return len(evidence & set(found)) / len(evidence) if evidence else float("nan")


def grading_of(runs: Iterable[Any], index: RecordingRetriever, evidence: frozenset[str]) -> Grading:
    """Kept and dropped hits of the agent's searches (`ToolRun`s), by whether they are evidence."""
    total = Grading()
    for run in runs:
        # A repeated search is not re-run (no hits, none dropped): nothing was graded.
        if run.name != "search" or not (run.chunk_ids or run.dropped):
            continue
        kept = set(run.chunk_ids)
        hits = index.searches[run.arguments["query"].strip()]
        is_evidence = [h.doc_id in evidence for h in hits]
        in_kept = [h.chunk_id in kept for h in hits]
        total += Grading(
            sum(e and k for e, k in zip(is_evidence, in_kept, strict=True)),
            sum(e and not k for e, k in zip(is_evidence, in_kept, strict=True)),
            sum(not e and k for e, k in zip(is_evidence, in_kept, strict=True)),
            sum(not e and not k for e, k in zip(is_evidence, in_kept, strict=True)),
        )
    return total


def step_times(started: float, call_starts: Sequence[float], finished: float) -> tuple[float, ...]:
    """Wall ms of each model turn with the tools it asked for; the first from the start."""
    if not call_starts:
        return ()
    edges = [started, *call_starts[1:], finished]
    return tuple((b - a) * 1000 for a, b in pairwise(edges))


async def written(llm: LLM, outcome: Answer | Generation) -> Answer:
    """The answer, with the final model call made as the pipeline makes it."""
    if isinstance(outcome, Answer):
        return outcome
    try:
        async with asyncio.timeout(outcome.timeout_s):
            completion = await llm.complete(
                LLMCall(
                    outcome.tier,
                    tuple(outcome.messages),
                    max_tokens=outcome.max_tokens,
                    route=outcome.route.value,
                )
            )
    except TimeoutError:
        if outcome.fallback is None:
            raise
        return outcome.fallback
    return finish(outcome, completion)


@dataclass(slots=True)
class Harness:
    retriever: Retriever
    embedder: Embedder
    classifier: LearnedClassifier
    vectors: dict[str, Vector]
    llm_for: Callable[[Question], LLM]
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)

    async def run(self, question: Question, strategy: str, agent: AgentConfig) -> Run:
        llm = TimedLLM(self.llm_for(question))
        index = RecordingRetriever(self.retriever)
        deps = AgentDeps(llm, index, self.embedder, self.retrieval.candidates)
        registry = build_registry(deps, self._registry_config(strategy, agent))
        started = time.perf_counter()
        ctx = self._context(question, strategy, frozenset(registry))
        outcome = await self._execute(registry, ctx)
        shown = outcome.sources if isinstance(outcome, Generation) else ()
        answer = await written(llm, outcome)
        finished = time.perf_counter()
        return _measured(question, answer, shown, index, step_times(started, llm.starts, finished))

    async def _execute(
        self, registry: dict[Route, Executor], ctx: RouteContext
    ) -> Answer | Generation:
        """The route's executor; a lookup that escalates goes to multihop, as in the pipeline."""
        outcome = await registry[ctx.decision.route](ctx)
        if isinstance(outcome, Escalation):
            outcome = await registry[Route.MULTIHOP](replace(ctx, escalation=outcome))
        assert not isinstance(outcome, Escalation), "the multihop executor never escalates"
        return outcome

    def _registry_config(self, strategy: str, agent: AgentConfig) -> RegistryConfig:
        r = self.retrieval
        # Only adaptive routing grades the lookup's evidence: always-lookup answers from it.
        grading = EscalationConfig() if strategy == "adaptive" else None
        return RegistryConfig(
            tiers=ModelsConfig().routes,
            lookup=LookupParams(k=r.k, candidates=r.candidates, grading=grading),
            agent=agent,
            full_context=False,  # 10,033 pages never fit a context window
        )

    def _context(
        self, question: Question, strategy: str, executable: frozenset[Route]
    ) -> RouteContext:
        r, vector = self.retrieval, self.vectors[question.text]
        policy = PolicyConfig(
            tenant=TENANT,
            allow_force_route=True,
            lexical_weight=r.lexical_weight,
            dense_weight=r.dense_weight,
            identifier_lexical_weight=r.identifier_lexical_weight,
            executable=executable,
        )
        classification = self.classifier.classify(question.text, vector)
        decision = decide(classification, STRATEGIES[strategy], question.text, policy)
        return RouteContext(TENANT, question.text, vector, (), decision)


def _measured(
    question: Question,
    answer: Answer,
    shown: tuple[Citation, ...],
    index: RecordingRetriever,
    step_ms: tuple[float, ...],
) -> Run:
    tools = [t for s in answer.steps for t in s.tools if t.status != "cap_reached"]
    shown_docs = {c.doc_id for c in shown} | {index.doc_of[c] for t in tools for c in t.chunk_ids}
    return Run(
        question=question,
        route=answer.route,
        escalated=answer.escalated,
        shown=frozenset(shown_docs),
        cited=frozenset(c.doc_id for c in answer.citations),
        model_calls=len(step_ms),
        agent_steps=len(answer.steps),
        tool_calls=len(tools),
        usage=usage_total(answer),
        step_ms=step_ms,
        total_ms=sum(step_ms),
        cap=answer.cap,
        grading=grading_of(tools, index, question.evidence),
        text=answer.text,
    )


# -- answer quality (only with a real model) --------------------------------------------------

_CITATION = re.compile(r"\[\d{1,3}\]")
_NUMBER_COMMAS = re.compile(r"(\d+,)+\d+(\.\d+)?")
_PUNCTUATION = re.compile(r"[,.?!:;]")


def normalise_answer(text: str) -> str:
    """FanOutQA's normalisation without its lemmatiser (spaCy): case, number commas,
    punctuation, spacing."""
    text = _NUMBER_COMMAS.sub(lambda m: m[0].replace(",", ""), str(text).casefold())
    return " ".join(_PUNCTUATION.sub("", text).split())


def answer_strings(answer: Any) -> list[str]:
    """The strings FanOutQA's loose accuracy looks for: list items, dict keys and values."""
    if isinstance(answer, list):
        return [s for a in answer for s in answer_strings(a)]
    if isinstance(answer, dict):
        return [s for a in (*answer, *answer.values()) for s in answer_strings(a)]
    if isinstance(answer, bool):
        return ["yes" if answer else "no"]
    return [str(answer)]


def loose_accuracy(answer: Any, text: str) -> float:
    """Share of the gold answer strings found, word-bounded, in the text (citations removed:
    a "[3]" must not match the answer 3)."""
    candidate = normalise_answer(_CITATION.sub(" ", text))
    wanted = [normalise_answer(s) for s in answer_strings(answer)]
    found = sum(bool(re.search(rf"\b{re.escape(w)}\b", candidate)) for w in wanted)
    return found / len(wanted) if wanted else float("nan")


def token_f1(answer: Any, text: str) -> float:
    gold = normalise_answer(" ".join(answer_strings(answer))).split()
    predicted = normalise_answer(_CITATION.sub(" ", text)).split()
    common = sum((Counter(gold) & Counter(predicted)).values())
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


# -- the report ------------------------------------------------------------------------------


def mean_with_interval(runs: Sequence[Run], value: Callable[[Run], float]) -> str:
    values = np.array([value(r) for r in runs], dtype=np.float64)
    groups = [r.question.group for r in runs]
    low, high = bootstrap(groups, values, values, _mean_of_second)  # type: ignore[arg-type]
    return f"{values.mean():.3f} [{low:.3f},{high:.3f}]"


def _mean_of_second(_: F64, values: F64) -> float:
    return float(values.mean())


def _percentiles(samples: Sequence[float]) -> str:
    if not samples:
        return f"{'-':>15}"
    p50, p95 = np.percentile(samples, [50, 95])
    return f"{p50:.1f}/{p95:.1f}"


def _caps(runs: Sequence[Run]) -> str:
    counts = Counter(r.cap for r in runs if r.cap is not None)
    return ", ".join(f"{cap} {n}" for cap, n in counts.most_common()) or "-"


def _shown_recall(r: Run) -> float:
    return evidence_recall(r.question.evidence, r.shown)


def _cited_recall(r: Run) -> float:
    return evidence_recall(r.question.evidence, r.cited)


def _share(runs: Sequence[Run], test: Callable[[Run], bool]) -> float:
    return sum(map(test, runs)) / len(runs)


Results = dict[tuple[str, str], list[Run]]


def print_recall(results: Results) -> None:
    print(
        f"{'questions':<12}{'strategy':<17}{'n':>4}{'recall shown [95% CI]':>25}"
        f"{'recall cited [95% CI]':>25}{'all shown':>10}{'agent':>7}{'escal.':>7}{'direct':>7}"
        "  caps"
    )
    for (population, strategy), runs in results.items():
        print(
            f"{population:<12}{strategy:<17}{len(runs):>4}"
            f"{mean_with_interval(runs, _shown_recall):>25}"
            f"{mean_with_interval(runs, _cited_recall):>25}"
            f"{_share(runs, lambda r: _shown_recall(r) == 1.0):>10.3f}"
            f"{_share(runs, lambda r: r.route is Route.MULTIHOP):>7.3f}"
            f"{_share(runs, lambda r: r.escalated):>7.3f}"
            f"{_share(runs, lambda r: r.route is Route.DIRECT):>7.3f}  {_caps(runs)}"
        )


def print_costs(results: Results) -> None:
    print(
        f"{'questions':<12}{'strategy':<17}{'calls/q':>8}{'steps/q':>8}{'tools/q':>8}"
        f"{'prompt/q':>9}{'compl/q':>8}{'$/q':>9}{'step ms p50/p95':>17}{'question ms p50/p95':>21}"
    )
    for (population, strategy), runs in results.items():
        usage = [r.usage for r in runs]
        steps = [ms for r in runs for ms in r.step_ms]
        print(
            f"{population:<12}{strategy:<17}{np.mean([r.model_calls for r in runs]):>8.2f}"
            f"{np.mean([r.agent_steps for r in runs]):>8.2f}"
            f"{np.mean([r.tool_calls for r in runs]):>8.2f}"
            f"{np.mean([u.prompt_tokens for u in usage]):>9.0f}"
            f"{np.mean([u.completion_tokens for u in usage]):>8.0f}"
            f"{np.mean([u.cost_usd for u in usage]):>9.5f}"
            f"{_percentiles(steps):>17}  {_percentiles([r.total_ms for r in runs]):>19}"
        )


def _grading_cells(runs: Sequence[Run]) -> str:
    g = sum((r.grading for r in runs), Grading())
    evidence = g.dropped_evidence / max(g.kept_evidence + g.dropped_evidence, 1)
    other = g.dropped_other / max(g.kept_other + g.dropped_other, 1)
    return (
        f"{g.kept_evidence:>11}{g.dropped_evidence:>11}{evidence:>10.3f}"
        f"{g.kept_other:>11}{g.dropped_other:>11}{other:>10.3f}"
    )


# Hits of the agent's searches whose page is evidence, and the others; "dropped" the share.
GRADING_HEADER = (
    f"{'evid kept':>11}{'evid drop':>11}{'dropped':>10}{'other kept':>11}{'other drop':>11}"
    f"{'dropped':>10}"
)


def print_grading(results: Results) -> None:
    print(f"{'questions':<12}{'strategy':<17}{GRADING_HEADER}")
    for (population, strategy), runs in results.items():
        if any(r.agent_steps for r in runs):
            print(f"{population:<12}{strategy:<17}{_grading_cells(runs)}")


def print_sweep(sweep: dict[float, list[Run]]) -> None:
    print(
        f"{'min_similarity':>14}{'recall shown [95% CI]':>25}{'recall cited [95% CI]':>25}"
        f"{GRADING_HEADER}{'prompt/q':>9}{'$/q':>9}  caps"
    )
    for threshold, runs in sweep.items():
        print(
            f"{threshold:>14g}{mean_with_interval(runs, _shown_recall):>25}"
            f"{mean_with_interval(runs, _cited_recall):>25}{_grading_cells(runs)}"
            f"{np.mean([r.usage.prompt_tokens for r in runs]):>9.0f}"
            f"{np.mean([r.usage.cost_usd for r in runs]):>9.5f}  {_caps(runs)}"
        )


def print_quality(results: Results) -> None:
    print(
        f"{'questions':<12}{'strategy':<17}{'loose accuracy [95% CI]':>26}{'token F1 [95% CI]':>26}"
    )
    for (population, strategy), runs in results.items():
        loose = mean_with_interval(runs, lambda r: loose_accuracy(r.question.answer, r.text))
        f1 = mean_with_interval(runs, lambda r: token_f1(r.question.answer, r.text))
        print(f"{population:<12}{strategy:<17}{loose:>26}{f1:>26}")


# -- main ------------------------------------------------------------------------------------


def agent_config(args: argparse.Namespace, **overrides: float) -> AgentConfig:
    given = {n: getattr(args, n) for n in AgentConfig.model_fields if getattr(args, n) is not None}
    return AgentConfig(**{**given, **overrides})


def real_llm(args: argparse.Namespace) -> LLM:
    """The gateway's LLM seam over litellm: `--model` as the large tier, `--small-model` (or
    the same model) as the small one, priced with the price options."""

    def tier(model: str, price_in: float, price_out: float) -> TierConfig:
        return TierConfig(
            model=model,
            api_base=args.api_base,
            api_key_env=args.api_key_env,
            input_cost_per_token=price_in / 1e6,
            output_cost_per_token=price_out / 1e6,
            timeout_s=args.timeout_s,
        )

    return LiteLLMTiers(
        tier(args.small_model or args.model, args.small_in, args.small_out),
        tier(args.model, args.large_in, args.large_out),
    )


def llm_factory(
    args: argparse.Namespace, shared: LLM | None
) -> tuple[Callable[[Question], LLM], str]:
    """A model per question (the scripted planner knows its plan) or the shared real one; and
    what it is, for the report."""
    if shared is not None:
        return (lambda _: shared), f"{args.model} (small tier {args.small_model or args.model})"
    prices = Prices(
        (args.small_in / 1e6, args.small_out / 1e6), (args.large_in / 1e6, args.large_out / 1e6)
    )
    note = (
        f"scripted planner (gold decompositions; read when a search shows < {args.thin_below} "
        f"passages); tokens = ceil(chars / {CHARS_PER_TOKEN}); USD per 1M tokens: small "
        f"{args.small_in:g} in / {args.small_out:g} out, "
        f"large {args.large_in:g} in / {args.large_out:g} out"
    )
    return (lambda q: ScriptedPlanner(q.plan, prices, thin_below=args.thin_below)), note


async def run_all(
    harness: Harness,
    strategies: dict[str, tuple[list[Question], Sequence[str]]],
    agent: AgentConfig,
) -> Results:
    results: Results = {}
    for population, (questions, names) in strategies.items():
        for name in names:
            results[(population, name)] = [await harness.run(q, name, agent) for q in questions]
    return results


async def evaluate(args: argparse.Namespace) -> None:
    docs = load_wiki_sample()
    parents, leaves, without = load_questions(args.parts, {d.doc_id for d in docs})
    parents, leaves = parents[: args.limit], leaves[: args.limit]
    shared = real_llm(args) if args.model else None
    llm_for, llm_note = llm_factory(args, shared)
    agent = agent_config(args)
    embedder, retriever = open_embedder(), open_embedded()
    try:
        print(await ensure_corpus("embedded", retriever, docs, embedder))
        texts = list(dict.fromkeys(t for q in parents + leaves for t in (q.text, *q.plan)))
        vectors = dict(zip(texts, await embedder.embed(texts), strict=True))
        embedder.save()
        use_model(embedder.model_id)
        classifier = LearnedClassifier.load(embedding_model_id=embedder.model_id)
        harness = Harness(retriever, embedder, classifier, vectors, llm_for)
        print_setup(args, parents, leaves, without, llm_note, agent)
        results = await run_all(
            harness,
            {MULTI_HOP: (parents, tuple(STRATEGIES)), SINGLE_HOP: (leaves, SINGLE_HOP_STRATEGIES)},
            agent,
        )
        sweep = {
            t: [
                await harness.run(q, "always-multihop", agent_config(args, min_similarity=t))
                for q in parents
            ]
            for t in sweep_thresholds(args)
        }
    finally:
        await retriever.aclose()
        await embedder.aclose()
        if shared is not None:
            await shared.aclose()
    print_report(args, results, sweep)


def sweep_thresholds(args: argparse.Namespace) -> tuple[float, ...]:
    if args.sweep is not None:
        return tuple(args.sweep)
    return () if args.model else SWEEP


def print_setup(
    args: argparse.Namespace,
    parents: Sequence[Question],
    leaves: Sequence[Question],
    without: int,
    llm_note: str,
    agent: AgentConfig,
) -> None:
    pages, plans = [len(q.evidence) for q in parents], [len(q.plan) for q in parents]
    print(
        f"data: FanOutQA dev, {'+'.join(args.parts)} part(s) of scripts/train_router.py's split; "
        f"{len(parents)} multi-hop parents with >= 1 evidence page in the corpus "
        f"({without} without any left out; evidence pages per parent: mean {np.mean(pages):.2f}, "
        f"max {max(pages)}; gold leaves per parent: mean {np.mean(plans):.2f}, max {max(plans)}); "
        f"{len(leaves)} single-hop leaves whose page it holds"
    )
    print(f"model: {llm_note}")
    print(f"agent: {agent.model_dump()}")
    r = RetrievalConfig()
    print(f"lookup: k={r.k}, candidates={r.candidates}")
    print(f"adaptive: the learned router, then escalation {EscalationConfig()}")
    print(f"machine: {os.cpu_count()} cores, load avg {_load()}\n")


def print_report(args: argparse.Namespace, results: Results, sweep: dict[float, list[Run]]) -> None:
    print("EVIDENCE RECALL per question (mean, 95% bootstrap CI by parent); route mix; caps hit")
    print_recall(results)
    print("\nCOST AND LATENCY per question (means; latency p50/p95 in ms)")
    print_costs(results)
    print("\nRELEVANCE GRADING of the agent's searches: hits kept/dropped, evidence vs other pages")
    print_grading(results)
    if sweep:
        print("\nGRADING THRESHOLD SWEEP: always-multihop on the multi-hop questions")
        print_sweep(sweep)
    if args.model:
        print("\nANSWER QUALITY against the FanOutQA dev answers")
        print_quality(results)


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each set")
    parser.add_argument("--parts", nargs="+", choices=("val", "test"), default=["test"])
    parser.add_argument("--thin-below", type=int, default=2, help="planner reads below this")
    parser.add_argument(
        "--sweep", type=float, nargs="*", default=None, help="min_similarity values to compare"
    )
    agent = parser.add_argument_group("agent caps and tools (AgentConfig; default: its defaults)")
    for name, info in AgentConfig.model_fields.items():
        agent.add_argument(f"--{name.replace('_', '-')}", type=type(info.default), default=None)
    model = parser.add_argument_group("a real model instead of the scripted planner")
    model.add_argument("--model", help="litellm model string for the large tier")
    model.add_argument("--small-model", help="litellm model string for the small tier")
    model.add_argument("--api-base")
    model.add_argument("--api-key-env", help="environment variable holding the API key")
    model.add_argument("--timeout-s", type=float, default=60.0)
    # The prices of bench/route_eval.py, so the two benches price tokens alike.
    defaults = route_eval_args([])
    prices = parser.add_argument_group("prices, USD per million tokens")
    for name in ("small_in", "small_out", "large_in", "large_out"):
        prices.add_argument(
            f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name)
        )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}")
    started = time.perf_counter()
    asyncio.run(evaluate(args))
    print(f"\nwall time {time.perf_counter() - started:.0f} s; load avg {_load()} at end")


if __name__ == "__main__":
    main()
