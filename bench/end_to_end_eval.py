"""End to end: the first citation of answers served through POST /v1/query.

    nice -n 10 python bench/end_to_end_eval.py                  # the tuning parts
    nice -n 10 python bench/end_to_end_eval.py --part heldout   # once, at the end
    nice -n 10 python bench/end_to_end_eval.py --opensearch-url http://127.0.0.1:9200


The gateway is the real app (`gateway.server.app.create_app`: its handler, middleware and
pipeline) on aiohttp's test server, in this process, answering `POST /v1/query` with
`"route": "auto"` and `"debug": true` for one tenant, `retrieval_eval.TENANT`, whose index is
bench/retrieval_eval.py's embedded index of the 10,033 Wikipedia lead sections (built there
and reused here: `ensure_corpus` only checks its manifest) or, with `--opensearch-url`, the
same sample on that node behind `--opensearch-alias`, as bench/rerank_candidates.py ingests it
(the chunk vectors read from the embedded run's cache). The services around it are the
ones `open_services` builds for each configuration (`build_reranker`, `build_quotas`, litellm's
tiers with no model), except the embedder: MiniLM on onnxruntime behind a disk cache of its
vectors by text (`retrieval_eval.CachedEmbedder`, its own file `end_to_end_vectors.npz`), so a
re-run embeds nothing twice; the vectors are the model's. The response cache is off, so each
answer is computed for its own question and never served from a neighbour's.

Configurations (both with no model configured, so every lookup answers extractively:
routers/extractive.py):
- `default`: the first-run default: the local reranker with the shipped policy
  (docs/reranking.md), its `timeout_s` raised to `RERANK_TIMEOUT_S` so that the shared
  machine's load does not turn a rerank into a `failed` one (failures are still counted);
- `fused`: the same with `retrieval.rerank.reranker: off` (fusion alone).

Query sets:
- `fanoutqa`: FanOutQA dev leaf sub-questions whose evidence page is in the sample
  (`retrieval_eval.load_queries`), split as bench/retrieval_eval.py splits them (`is_tuning`
  of the parent question); the parent is the bootstrap group;
- `direct`: the `information` rows of bench/data/direct_routing.jsonl
  (scripts/make_direct_benchmark.py: everyday search phrasings, each made from one article,
  its `page`), split by their own `split` field (`tune`, `heldout`), reported per `kind` and
  overall; each row is its own group (one query per article). None is dropped: a phrasing that
  does not identify one page ("chemical element") counts as it is.

Per configuration and set: R@1 and R@3 of the answer's citations (the evidence page is the
first, or among the first three, distinct documents the answer cites: a page is cited when
any of its chunks is), the share answered with no citation, the route shares (direct, lookup,
multihop), the share escalated (with no model: the honest "not enough evidence" answer, which
still cites the best passages), and the lookup search's rerank decisions; 95% bootstrap
intervals resampling whole groups (`retrieval_eval.interval`). The issue's targets are printed
beside the figures they apply to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file, the repo's packages are not on the path
    sys.path.insert(0, str(REPO))

from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder  # noqa: E402
from backends.llm.tiers import LiteLLMTiers  # noqa: E402
from bench.rerank_candidates import EMBEDDED, OpenSearchSource, open_retriever  # noqa: E402
from bench.retrieval_eval import (  # noqa: E402
    CACHE_DIR,
    OPENSEARCH_ALIAS,
    TENANT,
    CachedEmbedder,
    best_chunk_per_doc,
    ensure_corpus,
    first_relevant_rank,
    interval,
    load_queries,
    open_embedder,
    split,
)
from gateway.core.services import Services  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from gateway.obs.metrics import Metrics  # noqa: E402
from gateway.server.app import create_app  # noqa: E402
from gateway.server.services import build_quotas, build_reranker  # noqa: E402
from gateway.settings import Settings, hash_api_key  # noqa: E402

DIRECT_DATA = REPO / "bench" / "data" / "direct_routing.jsonl"
VECTORS = CACHE_DIR / "end_to_end_vectors.npz"
API_KEY = "end-to-end-eval-key"
RERANK_TIMEOUT_S = 30.0
CONFIGS = ("default", "fused")
ROUTES = ("direct", "lookup", "multihop")
TARGETS = {"fanoutqa": 0.85, "direct": 0.90}  # R@1 of the first citation, held out
ADDED_P50_TARGET_MS = 15.0  # what the default policy may add to a lookup at p50, c=1
PROGRESS_EVERY = 100


@dataclass(frozen=True, slots=True)
class Case:
    query: str
    page: str  # the evidence page's doc id
    group: str  # what the bootstrap resamples whole
    kind: str  # the direct set's kind of phrasing; "sub-question" for FanOutQA


@dataclass(frozen=True, slots=True)
class Served:
    """What one answer says that is scored: the documents it cites, in citation order."""

    cited: tuple[str, ...]
    route: str
    escalated: bool
    rerank: str  # the lookup search's rerank decision; "" when no lookup search ran
    total_ms: float  # the gateway's own `timings_ms.total` for the answer
    rerank_ms: float  # its `timings_ms.rerank` (0 when no stage ran)


def served_from(body: Mapping[str, Any]) -> Served:
    """The scored parts of a /v1/query answer (asked with `debug`)."""
    traces = (body.get("debug") or {}).get("rerank") or []
    lookup = [t["decision"] for t in traces if t["site"] == "lookup"]
    return Served(
        cited=tuple(c["doc_id"] for c in body["citations"]),
        route=body["route"],
        escalated=bool(body["escalated"]),
        rerank=lookup[0] if lookup else "",
        total_ms=float(body["timings_ms"]["total"]),
        rerank_ms=float(body["timings_ms"].get("rerank", 0.0)),
    )


def citation_rank(served: Served, page: str) -> int | None:
    """1-based place of `page` among the distinct documents the answer cites, else None."""
    cited = best_chunk_per_doc(served.cited)
    return first_relevant_rank(cited, page, depth=len(cited))


def recall_values(answers: Sequence[Served], cases: Sequence[Case], k: int) -> np.ndarray[Any, Any]:
    """Per answer: 1.0 when its case's page is among the first `k` documents it cites."""
    ranks = [citation_rank(s, c.page) for s, c in zip(answers, cases, strict=True)]
    return np.array([r is not None and r <= k for r in ranks], dtype=np.float64)


# -- the query sets ---------------------------------------------------------------------------


def fanoutqa_cases(corpus_ids: set[str], tuning: bool, limit: int | None) -> list[Case]:
    queries = split(load_queries(corpus_ids), tuning, limit)
    return [Case(q.text, q.page, q.parent, "sub-question") for q in queries]


def direct_cases(part: str, limit: int | None, path: Path = DIRECT_DATA) -> list[Case]:
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    chosen = [r for r in rows if r["label"] == "information" and r["split"] == part]
    cases = [Case(r["query"], r["page"], r["id"], r["kind"]) for r in chosen]
    return cases[:limit] if limit else cases


# -- the gateway ------------------------------------------------------------------------------


def settings_for(config: str, data_dir: Path) -> Settings:
    """The first-run default for one tenant (no model, `model: auto`), the response cache off;
    `fused`: with the reranker off."""
    rerank = {"reranker": "off"} if config == "fused" else {"timeout_s": RERANK_TIMEOUT_S}
    return Settings.model_validate(
        {
            "data_dir": data_dir,
            "tenants": [{"id": TENANT, "api_key_sha256": [hash_api_key(API_KEY)]}],
            "cache": {"backend": "off"},
            "retrieval": {"rerank": rerank},
        }
    )


async def open_gateway(
    stack: AsyncExitStack,
    settings: Settings,
    embedder: CachedEmbedder,
    source: OpenSearchSource | None,
) -> TestClient[Any, Any]:
    metrics = Metrics()
    retriever = open_retriever(source)
    stack.push_async_callback(retriever.aclose)
    quotas = build_quotas(settings, metrics, None)
    stack.push_async_callback(quotas.aclose)
    llm = LiteLLMTiers(settings.models.small, settings.models.large)
    stack.push_async_callback(llm.aclose)
    reranker = build_reranker(settings)
    if reranker is not None:
        stack.push_async_callback(reranker.aclose)
    services = Services(embedder, retriever, llm, None, metrics, quotas, reranker=reranker)
    app = create_app(settings, services=services)
    client: TestClient[Any, Any] = await stack.enter_async_context(TestClient(TestServer(app)))
    return client


async def ask(client: TestClient[Any, Any], query: str) -> Served:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"query": query, "route": "auto", "debug": True}
    async with client.post("/v1/query", json=body, headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200:  # never scored as a miss: the run stops and says why
            raise RuntimeError(f"/v1/query {resp.status} for {query!r}: {text}")
        return served_from(json.loads(text))


async def serve_all(
    config: str,
    sets: Mapping[str, Sequence[Case]],
    embedder: CachedEmbedder,
    source: OpenSearchSource | None,
) -> dict[str, list[Served]]:
    out: dict[str, list[Served]] = {}
    with tempfile.TemporaryDirectory(prefix="end-to-end-") as data_dir:
        async with AsyncExitStack() as stack:
            settings = settings_for(config, Path(data_dir))
            client = await open_gateway(stack, settings, embedder, source)
            for name, cases in sets.items():
                start = time.perf_counter()
                out[name] = []
                for i, case in enumerate(cases, start=1):
                    out[name].append(await ask(client, case.query))
                    if i % PROGRESS_EVERY == 0 or i == len(cases):
                        took = time.perf_counter() - start
                        progress = f"{i}/{len(cases)} ({took:.0f} s)"
                        print(f"  [{config}] {name} {progress}", file=sys.stderr)
                embedder.save()
    return out


# -- the report -------------------------------------------------------------------------------


def with_interval(values: np.ndarray[Any, Any], groups: Sequence[str]) -> str:
    low, high = interval(values, groups)
    return f"{values.mean():.3f} [{low:.3f}, {high:.3f}]"


def row(label: str, answers: Sequence[Served], cases: Sequence[Case]) -> str:
    groups = [c.group for c in cases]
    uncited = np.array([not s.cited for s in answers], dtype=np.float64)
    escalated = np.array([s.escalated for s in answers], dtype=np.float64)
    routes = Counter(s.route for s in answers)
    shares = "/".join(f"{routes[r] / len(answers):.2f}" for r in ROUTES)
    reranks = Counter(s.rerank or "none" for s in answers)
    return (
        f"{label:<28}{len(cases):>5}{with_interval(recall_values(answers, cases, 1), groups):>24}"
        f"{with_interval(recall_values(answers, cases, 3), groups):>24}"
        f"{with_interval(uncited, groups):>24}{shares:>16}{escalated.mean():>7.2f}   "
        + ", ".join(f"{d} {n}" for d, n in reranks.most_common())
    )


def report(
    results: Mapping[str, Mapping[str, list[Served]]], sets: Mapping[str, Sequence[Case]]
) -> list[str]:
    lines = [
        f"{'config / set':<28}{'n':>5}{'R@1 [95% CI]':>24}{'R@3 [95% CI]':>24}"
        f"{'no citation':>24}{'dir/look/multi':>16}{'escal':>7}   lookup rerank decisions"
    ]
    for config, by_set in results.items():
        for name, answers in by_set.items():
            cases = sets[name]
            lines.append(row(f"{config} / {name}", answers, cases))
            if name != "direct":
                continue
            for kind in sorted({c.kind for c in cases}):
                idx = [i for i, c in enumerate(cases) if c.kind == kind]
                lines.append(row(f"  {kind}", [answers[i] for i in idx], [cases[i] for i in idx]))
    return lines


def target_lines(
    results: Mapping[str, Mapping[str, list[Served]]], sets: Mapping[str, Sequence[Case]]
) -> list[str]:
    lines = []
    for config, by_set in results.items():
        for name, served in by_set.items():
            target = TARGETS[name]
            r1 = recall_values(served, sets[name], 1)
            low, high = interval(r1, [c.group for c in sets[name]])
            met = "met" if r1.mean() >= target else "not met"
            lines.append(
                f"  {config} / {name}: R@1 {r1.mean():.3f} [{low:.3f}, {high:.3f}] against "
                f"the target {target:.2f}: {met}"
            )
    return lines


def latency_lines(results: Mapping[str, Mapping[str, list[Served]]]) -> list[str]:
    """The gateway's own time per answer (`timings_ms`, one question at a time: c=1), per
    configuration and set, and what the default configuration adds to fusion alone at p50."""
    lines = [f"{'config / set':<28}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'rerank p50/p90':>18}"]
    for config, by_set in results.items():
        for name, served in by_set.items():
            total = np.array([s.total_ms for s in served])
            rerank = np.array([s.rerank_ms for s in served])
            p50, p90, p99 = np.percentile(total, [50, 90, 99])
            r50, r90 = np.percentile(rerank, [50, 90])
            lines.append(
                f"{config + ' / ' + name:<28}{p50:>9.1f}{p90:>9.1f}{p99:>9.1f}"
                f"{f'{r50:.1f} / {r90:.1f}':>18}"
            )
    if "default" in results and "fused" in results:
        for name in results["default"]:
            added = [
                float(np.percentile([s.total_ms for s in results[c][name]], 50))
                for c in ("default", "fused")
            ]
            lines.append(
                f"  {name}: the default policy adds {added[0] - added[1]:+.1f} ms at p50 "
                f"(target: at most +{ADDED_P50_TARGET_MS:.0f} ms)"
            )
    return lines


SETS = ("fanoutqa", "direct")


async def evaluate(args: argparse.Namespace) -> None:
    docs = load_wiki_sample()
    corpus_ids = {d.doc_id for d in docs}
    tuning = args.part == "tune"
    every = {
        "fanoutqa": lambda: fanoutqa_cases(corpus_ids, tuning, args.limit),
        "direct": lambda: direct_cases(args.part, args.limit),
    }
    sets = {name: every[name]() for name in args.sets}
    url = args.opensearch_url
    source = OpenSearchSource(url, args.opensearch_alias) if url else None
    label = f"{source.backend}-{source.alias}" if source else EMBEDDED
    corpus_embedder, index = open_embedder(), open_retriever(source)
    try:  # the bench's index, as bench/retrieval_eval.py built it (ingested only if missing)
        print(await ensure_corpus(label, index, docs, corpus_embedder))
    finally:
        await index.aclose()
        await corpus_embedder.aclose()
    for name, cases in sets.items():
        print(f"{name} {args.part}: {len(cases)} queries, {len({c.group for c in cases})} groups")
    embedder = CachedEmbedder(OnnxMiniLMEmbedder(), VECTORS)
    results: dict[str, dict[str, list[Served]]] = {}
    try:
        for config in args.configs:
            results[config] = await serve_all(config, sets, embedder, source)
    finally:
        await embedder.aclose()
    # A question or sentence embedded for the first time costs the model's pass, and the cache
    # a write, inside the answer's time: the first configuration would pay them for both.
    cold = embedder.computed
    print(f"\npart {args.part} on {label}, first citation of /v1/query answers, 95% CI by group:")
    print("\n".join(report(results, sets)))
    print("\nthe issue's targets (R@1 of the first citation, held out):")
    print("\n".join(target_lines(results, sets)))
    print("\nthe gateway's time per answer, c=1 (timings_ms; the embedder's vectors cached):")
    if cold:
        print(f"  not comparable: {cold} texts were embedded during this run; run it again")
    else:
        print("\n".join(latency_lines(results)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("tune", "heldout"), default="tune")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    parser.add_argument("--limit", type=int, default=None, help="at most N queries per set")
    parser.add_argument("--opensearch-url", default=None, help="this node, not the embedded index")
    parser.add_argument("--opensearch-alias", default=OPENSEARCH_ALIAS)
    args = parser.parse_args(argv)
    print(f"command: python {' '.join(sys.argv)}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load avg {load} at start")
    started = time.perf_counter()
    asyncio.run(evaluate(args))
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
