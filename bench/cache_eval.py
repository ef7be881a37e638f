"""Semantic cache evaluation: false hits and hits per threshold, with and without the guards,
on real questions; then the latency of an exact hit, a semantic hit and a miss in one run.

    python bench/cache_eval.py [--skip-latency] [--latency-questions N] [--skip-scale]
        [--precision int8]

Questions: FanOutQA dev (the installed `fanoutqa` package's fanout-final-dev.json; the test file
is never read), every parent question and every sub-question of its decomposition. Parents are
split as scripts/train_router.py splits them (sha256 of the parent id): train+val is the tuning
part the thresholds are chosen on, the test part is held out and only reported.

Hard negatives (pairs that must never share an answer):
- siblings: two sub-questions of one node, e.g. "What is the population of Macau?" and "… of
  Maldives?": one template, another entity or attribute (up to the first 12 children a node,
  distinct texts);
- parent/sub-question: a question and each of its direct sub-questions ("What is the population
  of the five smallest countries … ?" vs "What is the population of Macau?").

Positives (pairs that should share one), made from every question by deterministic rewrites
that keep its meaning, each rule applied alone where it changes the text:
- `contraction`: "What is" -> "What's", "Who is" -> "Who's", "Where is" -> "Where's", and the
  reverse, (a spelling of the same words);
- `polite`: "Can you tell me " before a question starting with a question word, its first
  letter lowered ("Can you tell me what is …?"): a request for the same information;
- `imperative`: "What is X?" / "What are X?" -> "Tell me X." (same information, no question
  form);
- `how_many`: "How many X …?" -> "What is the number of X …?" (the count either way);
- `which_year`: "In what year" <-> "In which year" (interchangeable interrogatives);
- `synonym`: one of film/movie, located/situated, called/named, biggest/largest,
  whole word, first occurrence (dictionary synonyms in these questions' sense).
None of them touches a number, a name, a date or a negation, so a guard that refuses one of
these pairs is the guard's own cost (biggest/largest is refused by the comparison guard on
purpose: its cost is measured).

A pair "hits" at threshold t when the cosine similarity of the two questions' MiniLM embeddings
(the gateway's own embedder) is at least t, and, with guards, no guard in gateway.cache.guards
tells them apart. Similarity and guards are symmetric, so one direction is counted. The
threshold for a route is chosen on the tuning part as the lowest 0.005 step whose guarded false
hits are zero on the negatives whose cached answer could belong to that route: lookup (and
full_context, direct) from sub-questions: siblings and parent/sub pairs; multihop from parents:
parent/sub pairs. Reported with the held-out rate and a 95% upper bound (3/n when 0 of n).

Review negatives: a fixed list of hand-written pairs a cold review found passing every guard
(order reversed, negation by prefix or without an apostrophe, hyphenated numbers and
ordinals, a decimal comma), each reported at the chosen threshold with its similarity and
the guard that refuses it; they are not tuned on. Pairs in scripts MiniLM's tokenizer does
not know (Thai, Amharic, emoji) are reported with their similarity and whether the gateway
would look them up semantically at all (it does not when the tokenizer produced [UNK]).

Scale: MemoryCacheStore.nearest at 1k, 10k and 100k entries in one tenant (latency, candidates
scored, recall@1 against brute force); the Redis store's is bench/cache_store_scale.py.

Latency: the real pipeline (gateway.core.pipeline.Pipeline) with the embedded index of the Wikipedia
sample that bench/retrieval_eval.py builds (copied; the acme test documents when it is absent),
no model configured (lookups answer extractively, so a miss is embed + classify + retrieve +
store, no model time), route forced to lookup, once with MemoryCacheStore and once with
RedisCacheStore on a redis-server this script starts (Debian's `redis-server`, loopback, no
persistence). For each of N held-out sub-questions with a positive rewrite that the chosen
threshold serves: the question (miss), the same again (exact hit) and its rewrite (semantic
hit, including its embedding), after 20 other questions asked the same way untimed (warm-up).
Wall time of prepare + complete per request, p50 / p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see bench/retrieval_eval.py

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.cache.base import CacheStore  # noqa: E402
from backends.cache.memory import MemoryCacheStore  # noqa: E402
from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder, Precision  # noqa: E402
from gateway.cache.guards import Facts, facts, refusal  # noqa: E402
from scripts.train_router import fanoutqa_path, split_of  # noqa: E402

THRESHOLDS = tuple(round(0.80 + 0.005 * i, 3) for i in range(40))  # 0.800 … 0.995
MAX_SIBLINGS = 12
WIKI_INDEX = REPO / ".cache" / "bench" / "retrieval" / "wiki.sqlite3"
WIKI_TENANT = "bench-wiki"
WARMUP = 20  # untimed questions first, for each store
EMBEDDINGS = REPO / ".cache" / "bench" / "cache_eval" / "embeddings.npz"
# `--precision int8`: the quantised graph (`embeddings.precision: int8`) instead of fp32, whose
# vectors (numpy or onnx, equal) the thresholds were chosen on; cached apart.
PRECISION: Precision = "fp32"


def make_embedder() -> MiniLMEmbedder | OnnxMiniLMEmbedder:
    return MiniLMEmbedder() if PRECISION == "fp32" else OnnxMiniLMEmbedder(precision=PRECISION)


def embeddings_path() -> Path:
    return (
        EMBEDDINGS if PRECISION == "fp32" else EMBEDDINGS.with_name(f"embeddings-{PRECISION}.npz")
    )


# -- data ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    part: str  # tuning | heldout
    is_parent: bool


@dataclass(frozen=True, slots=True)
class Pair:
    a: str
    b: str
    kind: str  # sibling | parent_sub | positive:<rule>
    part: str
    cached_parent: bool = False  # the pair's first question is a parent (multihop)


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def load_pairs() -> tuple[list[Question], list[Pair]]:
    dev = json.loads(fanoutqa_path("fanout-final-dev.json").read_text("utf-8"))
    questions: dict[str, Question] = {}
    pairs: list[Pair] = []
    for parent in dev:
        part = "heldout" if split_of(parent["id"]) == "test" else "tuning"
        questions.setdefault(parent["question"], Question(parent["question"], part, True))
        for node, is_root in _nodes(parent):
            children = [c["question"] for c in node["decomposition"]]
            for child in children:
                questions.setdefault(child, Question(child, part, False))
                if _norm(child) != _norm(node["question"]):
                    pairs.append(Pair(node["question"], child, "parent_sub", part, is_root))
            distinct = list(dict.fromkeys(children))[:MAX_SIBLINGS]
            for i, a in enumerate(distinct):
                for b in distinct[i + 1 :]:
                    if _norm(a) != _norm(b):
                        pairs.append(Pair(a, b, "sibling", part))
    for q in questions.values():
        for rule, rewrite in REWRITES.items():
            new = rewrite(q.text)
            if new != q.text and _norm(new) != _norm(q.text):
                pairs.append(Pair(q.text, new, f"positive:{rule}", q.part, q.is_parent))
    return list(questions.values()), pairs


def _nodes(parent: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every node with sub-questions, and whether it is the parent question itself."""
    stack = [(parent, True)]
    while stack:
        node, is_root = stack.pop()
        if node["decomposition"]:
            yield node, is_root
            stack.extend((c, False) for c in node["decomposition"])


_WH = ("what", "who", "which", "when", "where", "how", "why", "in what", "in which")
_CONTRACT = (("What is ", "What's "), ("Who is ", "Who's "), ("Where is ", "Where's "))
_SYNONYMS = (
    ("film", "movie"),
    ("movie", "film"),
    ("located", "situated"),
    ("called", "named"),
    ("largest", "biggest"),
    ("biggest", "largest"),
)


def _contraction(q: str) -> str:
    for long, short in _CONTRACT:
        if q.startswith(long):
            return short + q[len(long) :]
        if q.startswith(short):
            return long + q[len(short) :]
    return q


def _polite(q: str) -> str:
    if q.casefold().startswith(_WH):
        return "Can you tell me " + q[0].lower() + q[1:]
    return q


def _imperative(q: str) -> str:
    m = re.match(r"(?:What is|What are) (.+)\?$", q)
    return f"Tell me {m.group(1)}." if m else q


def _how_many(q: str) -> str:
    m = re.match(r"How many (.+)$", q)
    return f"What is the number of {m.group(1)}" if m else q


def _which_year(q: str) -> str:
    if q.startswith("In what year"):
        return "In which year" + q[len("In what year") :]
    if q.startswith("In which year"):
        return "In what year" + q[len("In which year") :]
    return q


def _synonym(q: str) -> str:
    for word, other in _SYNONYMS:
        new, n = re.subn(rf"\b{word}\b", other, q, count=1)
        if n:
            return new
    return q


REWRITES: dict[str, Callable[[str], str]] = {
    "contraction": _contraction,
    "polite": _polite,
    "imperative": _imperative,
    "how_many": _how_many,
    "which_year": _which_year,
    "synonym": _synonym,
}


# -- the curve -------------------------------------------------------------------------------


async def embed_all(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Unit MiniLM vectors of `texts`; those embedded by an earlier run are read back from
    EMBEDDINGS (the model's output does not change between runs)."""
    vectors: dict[str, np.ndarray] = {}
    path = embeddings_path()
    if path.exists():
        saved = np.load(path, allow_pickle=False)
        vectors = dict(zip(saved["texts"].tolist(), saved["vectors"], strict=True))
    todo = [t for t in dict.fromkeys(texts) if t not in vectors]
    if todo:
        embedder = make_embedder()
        try:
            for i in range(0, len(todo), 64):
                chunk = todo[i : i + 64]
                for text, vector in zip(chunk, await embedder.embed(chunk), strict=True):
                    v = np.asarray(vector, dtype=np.float32)
                    vectors[text] = v / np.linalg.norm(v)
        finally:
            await embedder.aclose()
        path.parent.mkdir(parents=True, exist_ok=True)
        names = list(vectors)
        np.savez(path, texts=np.array(names), vectors=np.stack([vectors[n] for n in names]))
    return {t: vectors[t] for t in texts}


@dataclass(slots=True)
class Scored:
    pair: Pair
    similarity: float
    refused_by: str | None


def score(pairs: Sequence[Pair], vectors: dict[str, np.ndarray]) -> list[Scored]:
    cache: dict[str, Facts] = {}

    def f(text: str) -> Facts:
        if text not in cache:
            cache[text] = facts(text)
        return cache[text]

    return [Scored(p, float(vectors[p.a] @ vectors[p.b]), refusal(f(p.a), f(p.b))) for p in pairs]


def rate(items: Sequence[Scored], t: float, guarded: bool) -> float:
    if not items:
        return float("nan")
    hits = sum(1 for s in items if s.similarity >= t and not (guarded and s.refused_by))
    return hits / len(items)


def upper_95(hits: int, n: int) -> float:
    """One-sided 95% upper bound of a rate: 3/n for 0 of n (rule of three), else Wilson."""
    if n == 0:
        return float("nan")
    if hits == 0:
        return 3 / n
    z, p = 1.645, hits / n
    centre = p + z * z / (2 * n)
    margin = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5)
    return (centre + margin) / (1 + z * z / n)


def groups(scored: Sequence[Scored], part: str) -> dict[str, list[Scored]]:
    mine = [s for s in scored if s.pair.part == part]
    return {
        "siblings": [s for s in mine if s.pair.kind == "sibling"],
        "parent/sub": [s for s in mine if s.pair.kind == "parent_sub"],
        "positives": [s for s in mine if s.pair.kind.startswith("positive:")],
    }


def choose(scored: Sequence[Scored]) -> dict[str, float]:
    """Per route: the lowest threshold whose guarded false hits are zero on the tuning part."""
    tuning = groups(scored, "tuning")
    lookup_negatives = tuning["siblings"] + tuning["parent/sub"]
    # a cached parent question (multihop) asked as one of its sub-questions
    multihop_negatives = [s for s in tuning["parent/sub"] if s.pair.cached_parent]

    def lowest(negatives: list[Scored]) -> float:
        for t in THRESHOLDS:
            if rate(negatives, t, guarded=True) == 0:
                return t
        return 1.0

    lookup = lowest(lookup_negatives)
    return {
        "direct": lookup,
        "lookup": lookup,
        "full_context": lookup,
        "multihop": lowest(multihop_negatives),
    }


def print_curve(scored: Sequence[Scored], part: str) -> None:
    g = groups(scored, part)
    n = {k: len(v) for k, v in g.items()}
    print(
        f"\n{part.upper()} part: {n['siblings']} sibling pairs, {n['parent/sub']} parent/sub "
        f"pairs, {n['positives']} positive pairs"
    )
    print(
        f"{'threshold':>9} | {'false hits: siblings':>22} | {'parent/sub':>17} | "
        f"{'hit rate: positives':>21}"
    )
    print(f"{'':>9} | {'raw':>10} {'guarded':>11} | {'raw':>8} {'guarded':>8} | "
          f"{'raw':>10} {'guarded':>10}")  # fmt: skip
    for t in (*THRESHOLDS[::2], THRESHOLDS[-1]):
        cells = []
        for key in ("siblings", "parent/sub", "positives"):
            width = 8 if key == "parent/sub" else 10
            raw, guarded = rate(g[key], t, False), rate(g[key], t, True)
            cells.append(f"{raw:>{width}.4f} {guarded:>{width if width == 8 else 11}.4f}")
        print(f"{t:>9.3f} | " + " | ".join(cells))


def print_rules(scored: Sequence[Scored], t: float) -> None:
    positives = [s for s in scored if s.pair.kind.startswith("positive:")]
    print(f"\npositives by rewrite rule at {t:.3f} (both parts): raw / guarded hit rate, n")
    for rule in REWRITES:
        mine = [s for s in positives if s.pair.kind == f"positive:{rule}"]
        print(f"  {rule:<12} {rate(mine, t, False):.3f} / {rate(mine, t, True):.3f}  n={len(mine)}")
    refused: dict[str, int] = {}
    for s in positives:
        if s.similarity >= t and s.refused_by:
            refused[s.refused_by] = refused.get(s.refused_by, 0) + 1
    print(f"  positives above {t:.3f} refused, by guard: {refused or 'none'}")


def print_chosen(scored: Sequence[Scored], chosen: dict[str, float]) -> None:
    held = groups(scored, "heldout")
    tune = groups(scored, "tuning")
    t = chosen["lookup"]
    m = chosen["multihop"]
    print("\nCHOSEN (lowest threshold with no guarded false hit on the tuning part):")
    print(f"  lookup/direct/full_context {t:.3f}, multihop {m:.3f}")
    for name, g in (("tuning", tune), ("held-out", held)):
        for key, threshold, route in (
            ("siblings", t, "lookup"),
            ("parent/sub", t, "lookup"),
            ("parent/sub", m, "multihop"),
        ):
            items = g[key]
            if route == "multihop":
                items = [s for s in items if s.pair.cached_parent]
            hits = sum(1 for s in items if s.similarity >= threshold and not s.refused_by)
            raw = sum(1 for s in items if s.similarity >= threshold)
            print(
                f"  {name:<8} {key:<10} {route:<8} at {threshold:.3f}: false hits guarded {hits}/"
                f"{len(items)} (95% upper {upper_95(hits, len(items)):.4f}), raw {raw}"
            )
        pos = g["positives"]
        print(
            f"  {name:<8} positives  at {t:.3f}: hit rate guarded {rate(pos, t, True):.3f}, "
            f"raw {rate(pos, t, False):.3f} (n={len(pos)})"
        )
    worst = sorted(
        (s for s in held["siblings"] + held["parent/sub"] if s.refused_by is None),
        key=lambda s: -s.similarity,
    )[:5]
    print("  nearest held-out negatives no guard refuses (what the threshold alone keeps out):")
    for s in worst:
        print(f"    {s.similarity:.3f}  {s.pair.a!r} vs {s.pair.b!r}")


REVIEW_NEGATIVES: tuple[tuple[str, str], ...] = (
    ("Did Germany invade France in 1940?", "Did France invade Germany in 1940?"),
    ("Convert 100 USD to EUR", "Convert 100 EUR to USD"),
    ("How do I migrate from MySQL to Postgres?", "How do I migrate from Postgres to MySQL?"),
    ("Is Paris north of London?", "Is London north of Paris?"),
    ("Is it legal to park on the sidewalk?", "Is it illegal to park on the sidewalk?"),
    ("Is the process reversible?", "Is the process irreversible?"),
    ("Why does my build work?", "Why doesnt my build work?"),
    ("What happened in the twenty-first century?", "What happened in the twenty-second century?"),
    ("Who won the nineteenth Tour de France?", "Who won the eighteenth Tour de France?"),
    ("Is the dose 1,5 mg per kg?", "Is the dose 15 mg per kg?"),
)
UNKNOWN_SCRIPT_NEGATIVES: tuple[tuple[str, str], ...] = (
    ("ราคาเท่าไหร่", "ประเทศไทยอยู่ที่ไหน"),  # Thai: "how much?" vs "where is Thailand?"
    ("ሰላም እንዴት ነህ", "ቡና የት ነው"),  # Amharic: "hello, how are you" vs "where is the coffee"
    ("🍕🍔", "🚗➡️🏠"),  # emoji only
)


def print_review(chosen: dict[str, float]) -> None:
    texts = [t for pair in REVIEW_NEGATIVES + UNKNOWN_SCRIPT_NEGATIVES for t in pair]
    vectors = asyncio.run(embed_all(texts))
    t = chosen["lookup"]
    print(f"\nREVIEW NEGATIVES (not tuned on), lookup threshold {t:.3f}:")
    hits = raw = 0
    for a, b in REVIEW_NEGATIVES:
        similarity = float(vectors[a] @ vectors[b])
        refused_by = refusal(facts(a), facts(b))
        raw += similarity >= t
        hits += similarity >= t and refused_by is None
        print(f"  {similarity:.3f}  refused by {refused_by or 'NONE'}: {a!r} vs {b!r}")
    print(f"  false hits guarded {hits}/{len(REVIEW_NEGATIVES)}, raw {raw}")
    embedder = make_embedder()
    window = embedder.token_window
    print("  scripts the tokenizer does not know (the semantic tier is skipped for them):")
    for a, b in UNKNOWN_SCRIPT_NEGATIVES:
        similarity = float(vectors[a] @ vectors[b])
        unknown = [window.unknown(x) if window.unknown else 0 for x in (a, b)]
        print(f"    {similarity:.3f}  [UNK] tokens {unknown}: {a!r} vs {b!r}")
    asyncio.run(embedder.aclose())


# -- latency ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


async def latency(
    pairs: Sequence[tuple[str, str]],
    warmup: Sequence[tuple[str, str]],
    thresholds: dict[str, float],
    store_name: str,
) -> dict[str, list[float]]:
    from backends.cache.redis import RedisCacheStore
    from backends.embeddings.coalescing import CoalescingEmbedder
    from backends.llm.tiers import LiteLLMTiers
    from backends.redis_client import RedisConnection, RedisOptions
    from backends.retrieval.embedded import EmbeddedRetriever
    from gateway.core.pipeline import Pipeline
    from gateway.core.request import QueryRequest
    from gateway.core.runtime import build_classifier
    from gateway.core.services import Services
    from gateway.ingest.pipeline import ingest_documents
    from gateway.ingest.readers import read_paths
    from gateway.obs.metrics import Metrics
    from gateway.settings import Settings, TenantConfig
    from tests.redis_server import running_redis

    settings = Settings(cache={"backend": "memory", "semantic": {"thresholds": thresholds}})
    tenant = TenantConfig(id=WIKI_TENANT, api_key_sha256=("0" * 64,))
    workdir = Path(tempfile.mkdtemp(prefix="cache-eval-"))
    embedder = CoalescingEmbedder(make_embedder())
    if WIKI_INDEX.exists():
        shutil.copy(WIKI_INDEX, workdir / "index.sqlite3")
        retriever = EmbeddedRetriever(workdir / "index.sqlite3")
    else:
        retriever = EmbeddedRetriever(workdir / "index.sqlite3")
        docs = list(read_paths([REPO / "tests" / "data" / "acme"]))
        await ingest_documents(WIKI_TENANT, docs, embedder, retriever)
    llm = LiteLLMTiers(None, None)
    out: dict[str, list[float]] = {"miss": [], "exact": [], "semantic": [], "unexpected": []}
    with contextlib_redis(store_name, running_redis) as url:
        connection = None
        store: CacheStore
        if url is None:
            store = MemoryCacheStore()
        else:
            connection = RedisConnection(RedisOptions(url))
            await connection.start()
            store = RedisCacheStore(connection)
        services = Services(embedder, retriever, llm, store, Metrics())
        pipeline = Pipeline(services, settings, build_classifier(settings, embedder.model_id))
        try:
            # Warm-up, untimed: the embedder, the index's pages and the store's pool.
            for i, (question, rewrite) in enumerate(warmup):
                for text in (question, question, rewrite):
                    request = QueryRequest(f"w{i}", tenant, text, route="lookup")
                    await pipeline.complete(await pipeline.prepare(request))
            for i, (question, rewrite) in enumerate(pairs):
                for text, expected in (
                    (question, "miss"),
                    (question, "exact"),
                    (rewrite, "semantic"),
                ):
                    request = QueryRequest(str(i), tenant, text, route="lookup")
                    start = time.perf_counter()
                    result = await pipeline.complete(await pipeline.prepare(request))
                    elapsed = (time.perf_counter() - start) * 1000
                    out[expected if result.cache == expected else "unexpected"].append(elapsed)
        finally:
            if connection is not None:
                await connection.aclose()
    await retriever.aclose()
    await embedder.aclose()
    await llm.aclose()
    shutil.rmtree(workdir, ignore_errors=True)
    return out


class contextlib_redis:
    """A redis-server for the run (its URL), or None for the memory store."""

    def __init__(self, store: str, running: Any) -> None:
        self._cm = running() if store == "redis" else None

    def __enter__(self) -> str | None:
        return None if self._cm is None else str(self._cm.__enter__().url)

    def __exit__(self, *exc: object) -> None:
        if self._cm is not None:
            self._cm.__exit__(*exc)


# -- the in-process store at scale ------------------------------------------------------------


async def memory_scale(real: np.ndarray, sizes: Sequence[int], probes: int) -> None:
    """MemoryCacheStore.nearest with 1k … 100k entries in one tenant's scope: latency, the
    candidates it scored and recall@1 against brute force (the Redis store: bench/
    cache_store_scale.py). Entries are real question vectors pulled toward another and
    noised (MiniLM's anisotropy kept, as cache_store_scale.py does); probes are an entry plus
    noise at cosine 0.95-0.99, the range the semantic tier acts on."""
    from backends.cache.base import CachedEntry

    rng = np.random.default_rng(7)
    dim = real.shape[1]

    def unit(v: np.ndarray) -> np.ndarray:
        out: np.ndarray = v / np.linalg.norm(v, axis=-1, keepdims=True)
        return out.astype(np.float32)

    def entries(n: int) -> np.ndarray:
        a = real[rng.integers(0, len(real), n)]
        b = real[rng.integers(0, len(real), n)]
        return unit(a + 0.35 * b + 0.25 * rng.standard_normal((n, dim)) / np.sqrt(dim) * 4)

    def near(v: np.ndarray, cosine: float) -> np.ndarray:
        noise = unit(rng.standard_normal(dim) - (rng.standard_normal(dim) @ v) * v)
        return unit(cosine * v + np.sqrt(1 - cosine**2) * noise)

    print(f"\nIN-PROCESS STORE AT SCALE: {probes} probes a size, one tenant, one scope")
    print(f"{'entries':>8} {'p50 ms':>8} {'p99 ms':>8} {'candidates p50/max':>19} {'recall@1':>9}")
    store = MemoryCacheStore()
    vectors = np.zeros((0, dim), dtype=np.float32)
    for size in sizes:
        new = entries(size - len(vectors))
        for i, v in enumerate(new, start=len(vectors)):
            entry = CachedEntry(f"k{i}", "q", b"{}", v)
            await store.put("t", "s", entry, ttl_s=3600, max_entries=max(sizes))
        vectors = np.vstack([vectors, new])
        times, candidates, found = [], [], 0
        for _ in range(probes):
            target = int(rng.integers(0, size))
            probe = near(vectors[target], float(rng.uniform(0.95, 0.99)))
            start = time.perf_counter()
            got = await store.nearest("t", "s", probe, 4)
            times.append((time.perf_counter() - start) * 1000)
            candidates.append(store.last_candidates)
            truth = int(np.argmax(vectors @ probe))
            found += bool(got) and got[0].entry.key == f"k{truth}"
        print(
            f"{size:>8} {percentile(times, 50):>8.3f} {percentile(times, 99):>8.3f} "
            f"{int(np.median(candidates)):>10}/{max(candidates):<8} {found / probes:>9.3f}"
        )


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--latency-questions", type=int, default=150)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--scale-sizes", default="1000,10000,100000")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    args = parser.parse_args()
    global PRECISION
    PRECISION = args.precision
    print(f"embedder precision: {PRECISION}")

    questions, pairs = load_pairs()
    print(
        f"FanOutQA dev: {len(questions)} distinct questions "
        f"({sum(q.is_parent for q in questions)} parents), {len(pairs)} pairs"
    )
    vectors = asyncio.run(embed_all([q.text for q in questions] + [p.b for p in pairs]))
    scored = score(pairs, vectors)
    print_curve(scored, "tuning")
    print_curve(scored, "heldout")
    chosen = choose(scored)
    print_chosen(scored, chosen)
    print_rules(scored, chosen["lookup"])
    print_review(chosen)
    if not args.skip_scale:
        real = np.stack([vectors[q.text] for q in questions])
        sizes = [int(x) for x in args.scale_sizes.split(",")]
        asyncio.run(memory_scale(real, sizes, probes=300))
    if args.skip_latency:
        return

    usable = [
        (s.pair.a, s.pair.b)
        for s in scored
        if s.pair.kind.startswith("positive:")
        and s.pair.part == "heldout"
        and not s.pair.cached_parent
        and s.similarity >= chosen["lookup"]
        and s.refused_by is None
    ]
    seen: set[str] = set()
    chosen_pairs = []
    for a, b in usable:  # one rewrite per question
        if a not in seen:
            seen.add(a)
            chosen_pairs.append((a, b))
    warmup = chosen_pairs[args.latency_questions : args.latency_questions + WARMUP]
    chosen_pairs = chosen_pairs[: args.latency_questions]
    print(
        f"\nLATENCY: {len(chosen_pairs)} held-out sub-questions, each asked (miss), asked again "
        "(exact hit) and rewritten (semantic hit); prepare + complete, ms"
    )
    index = "Wikipedia sample (10,033 docs)" if WIKI_INDEX.exists() else "acme test documents"
    print(f"index: embedded, {index}; no model (extractive lookups); 2 shared cores")
    print(f"{'store':<8} {'request':<10} {'n':>4} {'p50':>8} {'p99':>8}")
    for store_name in ("memory", "redis"):
        out = asyncio.run(latency(chosen_pairs, warmup, chosen, store_name))
        for kind in ("exact", "semantic", "miss"):
            values = out[kind]
            print(
                f"{store_name:<8} {kind:<10} {len(values):>4} {percentile(values, 50):>8.2f} "
                f"{percentile(values, 99):>8.2f}"
            )
        if out["unexpected"]:
            print(f"{store_name:<8} {len(out['unexpected'])} requests got another cache result")


if __name__ == "__main__":
    main()
