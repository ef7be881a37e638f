"""`querygate eval`: a configuration's routing and retrieval measured on an operator's own
labelled questions, before the configuration (or a retrained router) is rolled out.

    querygate --config FILE eval routes LABELS.jsonl [--tenant T] [--with-escalation] [--json]
    querygate --config FILE eval retrieval LABELS.jsonl --tenant T [--k 10] [--json]

Routes: each line `{"question": str, "route": "direct|lookup|multihop|full_context",
"history"?: [{"role", "content"}], "id"?: str, "note"?: str}`. The question goes through the
configuration's own classifier and policy (thresholds, rules, identifiers, the routes this
deployment can execute) exactly as `POST /v1/route` decides it; no LLM is called and nothing is
answered. The tenant's index is read only where the decision needs it: whether the whole corpus
fits (full context, when configured) and, with `--with-escalation`, the lookup's own retrieval and
evidence grade (`routers.lookup.plan_lookup` without a model): a lookup that escalates ends on
multihop where this deployment can run it, as the pipeline does. A follow-up (history given) is
classified as written: the small model's rewrite is not run, and the report counts such lines.

Retrieval: each line `{"question": str, "relevant": [doc_id, ...], "id"?, "note"?}`. Each
question is searched in the tenant's index three ways, BM25 only, dense only and fused, with the
request the lookup route makes (the configured `retrieval.candidates`, arm weights from the
policy: rules and the identifier weighting apply as they do for a lookup of that question).
Document level: a document's rank is the position of its first chunk among the hits;
recall@k is the share of a question's relevant documents ranked within k, averaged over
questions; MRR@10 the mean of 1 / the best-ranked relevant document's rank (0 when none is in
the top 10).

Intervals are 95% percentile bootstrap intervals over questions (1,000 resamples, seeded, so a
run is reproducible); differences between arms are paired (the same resamples).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from backends.llm.base import Message
from backends.retrieval.base import Retriever, SearchRequest, Vector
from gateway.settings import Settings
from gateway.text import InvalidText, clean_text, doc_id, is_blank
from routers.types import Route

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 20240601  # bench/route_eval.py's
MRR_DEPTH = 10
EMBED_BATCH = 64
ARMS: tuple[Literal["bm25", "dense", "hybrid"], ...] = ("bm25", "dense", "hybrid")
ROUTE_LABELS = tuple(r.value for r in Route)
_ROLES = ("user", "assistant")

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.int64]


class EvalError(ValueError):
    """Why an evaluation cannot run (a bad file, a tenant without documents); safe to show."""


# -- labelled files ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouteExample:
    line: int
    question: str
    route: Route
    history: tuple[Message, ...] = ()
    label: str | None = None  # the line's own "id"


@dataclass(frozen=True, slots=True)
class RetrievalExample:
    line: int
    question: str
    relevant: tuple[str, ...]
    label: str | None = None


def read_route_examples(path: Path, max_chars: int) -> list[RouteExample]:
    examples = []
    for where, record in _records(path, {"question", "route", "history", "id", "note"}):
        route = record.get("route")
        if route not in ROUTE_LABELS:
            raise EvalError(f"{where}: route must be one of {', '.join(ROUTE_LABELS)}")
        examples.append(
            RouteExample(
                where.line,
                _question(where, record, max_chars),
                Route(route),
                _history(where, record.get("history", [])),
                _label(where, record),
            )
        )
    return examples


def read_retrieval_examples(path: Path, max_chars: int) -> list[RetrievalExample]:
    examples = []
    for where, record in _records(path, {"question", "relevant", "id", "note"}):
        relevant = record.get("relevant")
        if not isinstance(relevant, list) or not relevant:
            raise EvalError(f"{where}: relevant must be a non-empty list of document ids")
        ids = []
        for n, raw in enumerate(relevant):
            if not isinstance(raw, str):
                raise EvalError(f"{where}: relevant[{n}] must be a string")
            try:
                ids.append(doc_id(raw))  # the canonical form ingest stores
            except InvalidText as exc:
                raise EvalError(f"{where}: relevant[{n}]: {exc}") from exc
        question = _question(where, record, max_chars)
        examples.append(
            RetrievalExample(where.line, question, tuple(dict.fromkeys(ids)), _label(where, record))
        )
    return examples


@dataclass(frozen=True, slots=True)
class _Where:
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def _records(path: Path, fields: set[str]) -> Iterator[tuple[_Where, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EvalError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise EvalError(f"{path}: {exc.strerror or exc}") from exc
    found = False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = _Where(path, number)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{where}: not JSON ({exc.msg}, column {exc.colno})") from exc
        if not isinstance(record, dict):
            raise EvalError(f"{where}: want a JSON object, got {type(record).__name__}")
        if unknown := sorted(set(record) - fields):
            raise EvalError(
                f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(fields))})"
            )
        found = True
        yield where, record
    if not found:
        raise EvalError(f"{path}: no labelled questions (one JSON object a line)")


def _question(where: _Where, record: dict[str, Any], max_chars: int) -> str:
    value = record.get("question")
    if not isinstance(value, str):
        raise EvalError(f"{where}: question must be a string")
    question = _clean(where, "question", value).strip()
    if is_blank(question):  # the gateway's rule: it would refuse the question with 422
        raise EvalError(f"{where}: question is blank (white space or invisible characters only)")
    if len(question) > max_chars:
        raise EvalError(
            f"{where}: question is over server.max_query_chars ({max_chars}): the gateway "
            "would refuse it"
        )
    return question


def _history(where: _Where, value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list):
        raise EvalError(f"{where}: history must be a list of {{role, content}} objects")
    messages = []
    for n, item in enumerate(value):
        field = f"history[{n}]"
        if not isinstance(item, dict) or set(item) != {"role", "content"}:
            raise EvalError(f"{where}: {field} must be an object with role and content only")
        if item["role"] not in _ROLES:
            raise EvalError(f"{where}: {field}.role must be user or assistant")
        if not isinstance(item["content"], str):
            raise EvalError(f"{where}: {field}.content must be a string")
        messages.append(Message(item["role"], _clean(where, f"{field}.content", item["content"])))
    return tuple(messages)


def _label(where: _Where, record: dict[str, Any]) -> str | None:
    for field in ("id", "note"):
        if field in record and not isinstance(record[field], str):
            raise EvalError(f"{where}: {field} must be a string")
    label = record.get("id")
    return label if isinstance(label, str) else None


def _clean(where: _Where, field: str, value: str) -> str:
    try:
        return clean_text(value)
    except InvalidText as exc:
        raise EvalError(f"{where}: {field} {exc}") from exc


# -- metrics (shared with bench/) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Estimate:
    """A statistic over n questions with its 95% bootstrap interval; None where undefined."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"value": _r(self.value), "ci95": [_r(self.low), _r(self.high)], "n": self.n}

    def __str__(self) -> str:
        if self.value is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.value:.3f}"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def bootstrap_interval(
    statistic: Callable[[Rows], float],
    n: int,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """95% percentile interval of `statistic(rows)` over `samples` resamples of rows 0..n-1
    with replacement; None when it is undefined on every resample."""
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n, n)) for _ in range(samples)])
    if np.isnan(values).all():
        return None
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return float(low), float(high)


def estimate(values: F64, seed: int = BOOTSTRAP_SEED) -> Estimate:
    """The mean of per-question `values` (NaN rows excluded) with its bootstrap interval."""
    defined = values[~np.isnan(values)]
    if not len(defined):
        return Estimate(None, None, None, 0)
    interval = bootstrap_interval(lambda rows: float(defined[rows].mean()), len(defined), seed=seed)
    low, high = interval if interval is not None else (None, None)
    return Estimate(float(defined.mean()), low, high, len(defined))


def document_ranks(doc_ids: Sequence[str]) -> dict[str, int]:
    """Each document's 1-based rank: the position of its first (best) chunk among the hits."""
    ranks: dict[str, int] = {}
    for rank, doc in enumerate(doc_ids, start=1):
        ranks.setdefault(doc, rank)
    return ranks


def recall_at(ranks: dict[str, int], relevant: Collection[str], k: int) -> float:
    """Share of the relevant documents ranked within k (one question)."""
    return sum(ranks.get(d, k + 1) <= k for d in relevant) / len(relevant)


def reciprocal_rank(
    ranks: dict[str, int], relevant: Collection[str], depth: int = MRR_DEPTH
) -> float:
    """1 / the best-ranked relevant document's rank, 0 when none is within `depth`."""
    best = min((ranks[d] for d in relevant if d in ranks), default=None)
    return 0.0 if best is None or best > depth else 1.0 / best


@dataclass(frozen=True, slots=True)
class RouteScores:
    accuracy: Estimate
    multihop_recall: Estimate
    # Of the questions labelled lookup (single-hop), the share that ends on multihop.
    single_hop_flagged_multihop: Estimate
    per_route: dict[str, dict[str, float | int | None]]
    routes: tuple[str, ...]  # the confusion matrix's row and column order
    confusion: list[list[int]]  # rows expected, columns predicted


def route_scores(expected: Sequence[Route], predicted: Sequence[Route]) -> RouteScores:
    y, p = np.array([r.value for r in expected]), np.array([r.value for r in predicted])
    routes = tuple(r for r in ROUTE_LABELS if r in set(y) | set(p))
    multihop, lookup = y == Route.MULTIHOP.value, y == Route.LOOKUP.value
    on_multihop = (p == Route.MULTIHOP.value).astype(np.float64)
    per_route: dict[str, dict[str, float | int | None]] = {}
    for route in routes:
        true, said = y == route, p == route
        hits = int((true & said).sum())
        per_route[route] = {
            "precision": _r(hits / said.sum()) if said.any() else None,
            "recall": _r(hits / true.sum()) if true.any() else None,
            "support": int(true.sum()),
            "predicted": int(said.sum()),
        }
    return RouteScores(
        accuracy=estimate((y == p).astype(np.float64)),
        multihop_recall=estimate(np.where(multihop, on_multihop, np.nan)),
        single_hop_flagged_multihop=estimate(np.where(lookup, on_multihop, np.nan)),
        per_route=per_route,
        routes=routes,
        confusion=[[int(((y == a) & (p == b)).sum()) for b in routes] for a in routes],
    )


# -- running the configuration ----------------------------------------------------------------


def _tenant_flags(settings: Settings, tenant: str) -> tuple[bool, bool]:
    """(allow_force_route, allow_full_context) of a configured tenant."""
    if not settings.tenants:
        return True, True  # the demo tenant, or any tenant of an unconfigured deployment
    for t in settings.tenants:
        if t.id == tenant:
            return t.allow_force_route, t.allow_full_context
    known = ", ".join(t.id for t in settings.tenants)
    raise EvalError(f"--tenant {tenant}: not a configured tenant ({known})")


async def _embed_all(embedder: Any, texts: Sequence[str]) -> Vector:
    parts = [
        await embedder.embed(list(texts[i : i + EMBED_BATCH]))
        for i in range(0, len(texts), EMBED_BATCH)
    ]
    return np.concatenate(parts).astype(np.float32)


async def _require_documents(retriever: Retriever, settings: Settings, tenant: str) -> None:
    docs, _ = await retriever.stats(tenant)
    if docs == 0:
        raise EvalError(
            f"tenant {tenant} has no documents in the {retriever.name} index of this "
            f"configuration (data_dir {settings.data_dir}): ingest them first "
            f"(querygate ingest --tenant {tenant} ...)"
        )


async def evaluate_routes(
    settings: Settings,
    path: Path,
    tenant: str,
    *,
    with_escalation: bool = False,
    show: int = 10,
) -> dict[str, Any]:
    from backends.embeddings.config import build_embedder
    from gateway.core.routing import configured_routes, policy_for, registry_config
    from gateway.core.runtime import build_classifier
    from gateway.server.services import build_retriever
    from gateway.settings import ConfigError
    from routers.full_context import corpus_chunks
    from routers.lookup import plan_lookup
    from routers.policy import decide, with_full_context
    from routers.rewrite import looks_like_followup
    from routers.sufficiency import SufficiencyModelMismatch, use_model
    from routers.types import Escalation, RouteContext

    examples = read_route_examples(path, settings.server.max_query_chars)
    force, whole_corpus = _tenant_flags(settings, tenant)
    executable = configured_routes(settings)
    policy = policy_for(
        settings, tenant, executable, allow_force_route=force, whole_corpus_allowed=whole_corpus
    )
    params = registry_config(settings).lookup
    if with_escalation and params.grading is None:
        raise EvalError(
            "--with-escalation: router.escalation.enabled is false in this configuration, "
            "so no lookup escalates"
        )
    embedder = build_embedder(settings.embeddings)
    retriever: Retriever | None = None
    try:
        classifier = build_classifier(settings, embedder.model_id)
        if with_escalation and params.grading is not None and params.grading.method == "learned":
            try:
                use_model(embedder.model_id)
            except SufficiencyModelMismatch as exc:
                raise ConfigError(f"router.escalation.method: {exc}") from exc
        if with_escalation or Route.FULL_CONTEXT in executable:
            retriever = build_retriever(settings, embedder.dimension)
        if with_escalation:
            assert retriever is not None
            await _require_documents(retriever, settings, tenant)
        vectors = await _embed_all(embedder, [e.question for e in examples])
        corpus_fits: bool | None = None  # whether the tenant's corpus fits: one read per run
        rows: list[dict[str, Any]] = []
        for example, vector in zip(examples, vectors, strict=True):
            classification = classifier.classify(example.question, vector)
            decision = decide(classification, "auto", example.question, policy)
            if decision.full_context_candidate and retriever is not None:
                if corpus_fits is None:
                    fits = await corpus_chunks(
                        retriever, tenant, vector, settings.router.full_context
                    )
                    corpus_fits = fits is not None
                if corpus_fits:
                    decision = with_full_context(decision)
            route, escalated = decision.route, None
            if with_escalation and route is Route.LOOKUP:
                assert retriever is not None
                ctx = RouteContext(tenant, example.question, vector, example.history, decision)
                outcome = await plan_lookup(ctx, retriever, params, None)
                escalated = outcome.reason if isinstance(outcome, Escalation) else None
                if escalated is not None and Route.MULTIHOP in executable:
                    route = Route.MULTIHOP
            rows.append(
                {
                    "line": example.line,
                    "id": example.label,
                    "question": example.question,
                    "expected": example.route.value,
                    "predicted": route.value,
                    "classifier": classification.route.value,
                    "confidence": round(classification.confidence, 4),
                    "reason": decision.reason,
                    "escalated": escalated,
                    "unavailable": decision.wanted.value if decision.wanted else None,
                    "followup": looks_like_followup(example.question, example.history),
                    "explanation": decision.explanation,
                }
            )
    finally:
        if retriever is not None:
            await retriever.aclose()
        await embedder.aclose()
    return _route_report(
        settings, path, tenant, classifier.name, executable, rows, show, with_escalation
    )


def _route_report(
    settings: Settings,
    path: Path,
    tenant: str,
    classifier: str,
    executable: frozenset[Route],
    rows: list[dict[str, Any]],
    show: int,
    with_escalation: bool,
) -> dict[str, Any]:
    expected = [Route(r["expected"]) for r in rows]
    scores = route_scores(expected, [Route(r["predicted"]) for r in rows])
    alone = route_scores(expected, [Route(r["classifier"]) for r in rows])
    wrong = [r for r in rows if r["predicted"] != r["expected"]]
    wrong.sort(key=lambda r: (-r["confidence"], r["line"]))
    rewrites = settings.router.rewrite_followups and settings.models.small is not None
    return {
        "evaluation": "routes",
        "file": str(path),
        "tenant": tenant,
        "config_version": settings.version,
        "classifier": classifier,
        "executable_routes": sorted(r.value for r in executable),
        "with_escalation": with_escalation,
        "n": len(rows),
        "accuracy": scores.accuracy.as_dict(),
        "multihop_recall": scores.multihop_recall.as_dict(),
        "single_hop_flagged_multihop": scores.single_hop_flagged_multihop.as_dict(),
        "per_route": scores.per_route,
        "confusion": {"routes": list(scores.routes), "rows": scores.confusion},
        "classifier_alone": {
            "accuracy": alone.accuracy.as_dict(),
            "multihop_recall": alone.multihop_recall.as_dict(),
        },
        "escalated": sum(r["escalated"] is not None for r in rows) if with_escalation else None,
        "wanted_unavailable_route": sum(r["unavailable"] is not None for r in rows),
        "followups_classified_unrewritten": (sum(r["followup"] for r in rows) if rewrites else 0),
        "misrouted": len(wrong),
        "worst_misroutes": wrong[:show],
        "bootstrap": {"samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED, "level": 0.95},
    }


async def evaluate_retrieval(
    settings: Settings, path: Path, tenant: str, *, k: int = 10, show: int = 10
) -> dict[str, Any]:
    from backends.embeddings.config import build_embedder
    from gateway.core.routing import configured_routes, policy_for, registry_config
    from gateway.core.runtime import build_classifier
    from gateway.server.services import build_retriever
    from routers.policy import decide

    examples = read_retrieval_examples(path, settings.server.max_query_chars)
    _tenant_flags(settings, tenant)
    # The weights a lookup of each question gets: forcing lookup keeps the classifier's
    # evidence for rules and applies the identifier weighting.
    policy = policy_for(settings, tenant, configured_routes(settings))
    candidates = registry_config(settings).lookup.candidates
    depth = max(k, MRR_DEPTH)
    embedder = build_embedder(settings.embeddings)
    retriever = build_retriever(settings, embedder.dimension)
    try:
        await _require_documents(retriever, settings, tenant)
        relevant = sorted({d for e in examples for d in e.relevant})
        stored = await retriever.content_hashes(tenant, relevant)
        classifier = build_classifier(settings, embedder.model_id)
        vectors = await _embed_all(embedder, [e.question for e in examples])
        recall: dict[str, list[float]] = {arm: [] for arm in ARMS}
        rr: dict[str, list[float]] = {arm: [] for arm in ARMS}
        misses = []
        for example, vector in zip(examples, vectors, strict=True):
            classification = classifier.classify(example.question, vector)
            decision = decide(classification, "lookup", example.question, policy)
            for arm in ARMS:
                hits = await retriever.search(
                    SearchRequest(
                        tenant=tenant,
                        text=example.question,
                        vector=vector,
                        k=depth,
                        mode=arm,
                        lexical_weight=decision.lexical_weight,
                        dense_weight=decision.dense_weight,
                        candidates=candidates,
                    )
                )
                ranks = document_ranks([h.doc_id for h in hits])
                recall[arm].append(recall_at(ranks, example.relevant, k))
                rr[arm].append(reciprocal_rank(ranks, example.relevant))
                if arm == "hybrid" and recall[arm][-1] < 1:
                    misses.append(
                        {
                            "line": example.line,
                            "id": example.label,
                            "question": example.question,
                            "missing": [d for d in example.relevant if ranks.get(d, k + 1) > k],
                            "ranks": {d: ranks.get(d) for d in example.relevant},
                            "top": list(ranks)[:3],
                            "lexical_weight": decision.lexical_weight,
                        }
                    )
    finally:
        await retriever.aclose()
        await embedder.aclose()
    arrays = {arm: np.array(recall[arm]) for arm in ARMS}
    hybrid = arrays["hybrid"]
    return {
        "evaluation": "retrieval",
        "file": str(path),
        "tenant": tenant,
        "config_version": settings.version,
        "backend": settings.retrieval.backend,
        # Where the configuration names no fusion method, the backends fuse by RRF.
        "fusion": str(getattr(settings.retrieval, "fusion", "rrf")),
        "k": k,
        "n": len(examples),
        "arms": {
            arm: {
                "recall_at_k": estimate(arrays[arm]).as_dict(),
                "mrr_at_10": estimate(np.array(rr[arm])).as_dict(),
            }
            for arm in ARMS
        },
        # Paired: the same resampled questions for both arms.
        "hybrid_minus_arm_recall_at_k": {
            arm: estimate(hybrid - arrays[arm]).as_dict() for arm in ("bm25", "dense")
        },
        "relevant_not_in_index": [d for d in relevant if d not in stored],
        "missed": len(misses),
        "misses": misses[:show],
        "bootstrap": {"samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED, "level": 0.95},
    }


# -- the readable report ----------------------------------------------------------------------


def _est(value: dict[str, Any]) -> str:
    if value["value"] is None:
        return "n/a"
    low, high = value["ci95"]
    interval = "" if low is None else f" [{low:.3f}, {high:.3f}]"
    return f"{value['value']:.3f}{interval}"


def render_routes(report: dict[str, Any]) -> str:
    lines = [
        f"{report['file']}: {report['n']} questions, tenant {report['tenant']}, "
        f"config {report['config_version']}, classifier {report['classifier']}, "
        f"routes this config executes: {', '.join(report['executable_routes'])}"
        + (", lookups graded for escalation" if report["with_escalation"] else ""),
        "",
        f"  accuracy                      {_est(report['accuracy'])}",
        f"  multihop recall               {_est(report['multihop_recall'])}",
        f"  lookup questions to multihop  {_est(report['single_hop_flagged_multihop'])}",
        f"  classifier alone: accuracy {_est(report['classifier_alone']['accuracy'])}, "
        f"multihop recall {_est(report['classifier_alone']['multihop_recall'])}",
        "",
        f"  {'route':<14}{'precision':>10}{'recall':>8}{'labelled':>10}{'predicted':>11}",
    ]
    for route, m in report["per_route"].items():
        cells = [("-" if m[f] is None else f"{m[f]:.3f}") for f in ("precision", "recall")]
        lines.append(
            f"  {route:<14}{cells[0]:>10}{cells[1]:>8}{m['support']:>10}{m['predicted']:>11}"
        )
    routes = report["confusion"]["routes"]
    lines += ["", "  confusion (rows labelled, columns predicted):"]
    lines.append("  " + " " * 14 + "".join(f"{r:>14}" for r in routes))
    for route, row in zip(routes, report["confusion"]["rows"], strict=True):
        lines.append(f"  {route:<14}" + "".join(f"{c:>14}" for c in row))
    notes = []
    if report["escalated"] is not None:
        where = (
            "counted as multihop"
            if "multihop" in report["executable_routes"]
            else "this config cannot run multihop: they stay lookups that say the evidence is "
            "not enough"
        )
        notes.append(f"lookups escalated by the evidence grade: {report['escalated']} ({where})")
    if report["wanted_unavailable_route"]:
        notes.append(
            f"{report['wanted_unavailable_route']} questions wanted a route this config cannot "
            "execute (answered by lookup)"
        )
    if report["followups_classified_unrewritten"]:
        notes.append(
            f"{report['followups_classified_unrewritten']} follow-ups classified as written "
            "(the gateway would rewrite them with the small model first)"
        )
    lines += [""] + [f"  note: {n}" for n in notes] if notes else []
    worst = report["worst_misroutes"]
    lines += ["", f"  misrouted {report['misrouted']}; most confident first:"]
    for r in worst:
        esc = f", escalated ({r['escalated']})" if r["escalated"] else ""
        lines.append(
            f"  line {r['line']}: labelled {r['expected']}, routed {r['predicted']} "
            f"(classifier {r['classifier']} p={r['confidence']:.2f}, {r['reason']}{esc}): "
            f"{_short(r['question'])}"
        )
    b = report["bootstrap"]
    lines += [
        "",
        f"  intervals: 95% bootstrap over questions, {b['samples']} resamples, seed {b['seed']}",
    ]
    return "\n".join(lines)


def render_retrieval(report: dict[str, Any]) -> str:
    k = report["k"]
    recall_key, mrr_key = "recall_at_k", "mrr_at_10"
    lines = [
        f"{report['file']}: {report['n']} questions, tenant {report['tenant']}, "
        f"{report['backend']} backend, {report['fusion']} fusion, "
        f"config {report['config_version']}",
        "",
        f"  {'arm':<8}{f'recall@{k} [95% CI]':>28}{f'MRR@{MRR_DEPTH} [95% CI]':>28}",
    ]
    for arm, m in report["arms"].items():
        lines.append(f"  {arm:<8}{_est(m[recall_key]):>28}{_est(m[mrr_key]):>28}")
    diffs = report["hybrid_minus_arm_recall_at_k"]
    lines.append(
        f"  hybrid - bm25 {_signed(diffs['bm25'])}   hybrid - dense {_signed(diffs['dense'])}"
        "   (paired)"
    )
    if report["relevant_not_in_index"]:
        ids = report["relevant_not_in_index"]
        lines.append(
            f"  note: {len(ids)} relevant ids are not in the tenant's index: "
            + ", ".join(ids[:5])
            + (", ..." if len(ids) > 5 else "")
        )
    lines += ["", f"  hybrid missed a relevant document within {k} on {report['missed']}:"]
    for m in report["misses"]:
        ranks = ", ".join(
            f"{d} rank {r or '-'}" for d, r in m["ranks"].items() if d in m["missing"]
        )
        lines.append(
            f"  line {m['line']}: {_short(m['question'])}  missing {ranks}; "
            f"top {', '.join(m['top'])}"
        )
    b = report["bootstrap"]
    lines += [
        "",
        f"  intervals: 95% bootstrap over questions, {b['samples']} resamples, seed {b['seed']}",
    ]
    return "\n".join(lines)


def _signed(value: dict[str, Any]) -> str:
    if value["value"] is None:
        return "n/a"
    low, high = value["ci95"]
    return f"{value['value']:+.3f} [{low:+.3f}, {high:+.3f}]"


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def finite(report: Any) -> Any:
    """`report` with NaN replaced by None, so `json.dumps` writes valid JSON."""
    if isinstance(report, dict):
        return {k: finite(v) for k, v in report.items()}
    if isinstance(report, list):
        return [finite(v) for v in report]
    if isinstance(report, float) and not math.isfinite(report):
        return None
    return report
