"""`querygate eval`'s readable report, and the JSON one made valid (no NaN)."""

from __future__ import annotations

import math
from typing import Any

from gateway.eval.stats import MRR_DEPTH


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
    if "rerank" in report:
        lines += _rerank_lines(report["rerank"])
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


def _rerank_lines(rerank: dict[str, Any]) -> list[str]:
    """The rows with reranking, under fusion's, and their paired differences from it."""
    lines = [f"  with the {rerank['reranker']} reranker {rerank['model']}:"]
    for row, m in rerank["arms"].items():
        lines.append(f"  {row:<14}{_est(m['recall_at_k']):>22}{_est(m['mrr_at_10']):>28}")
    for row, d in rerank["minus_hybrid"].items():
        lines.append(
            f"  {row} - hybrid: recall {_signed(d['recall_at_k'])}, "
            f"MRR {_signed(d['mrr_at_10'])} (paired)"
        )
    decisions = ", ".join(f"{k} {v}" for k, v in rerank["policy_decisions"].items())
    lines.append(f"  policy decisions: {decisions}; reranker cost ${rerank['cost_usd']:g}")
    return lines


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
