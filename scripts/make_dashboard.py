"""Write the Grafana dashboard the chart ships: helm/querygate/files/dashboards/querygate.json.

The dashboard is code: edit the panels here, run `python scripts/make_dashboard.py`, commit both.
tests/integration/test_dashboard_and_alerts.py fails when the JSON is not this script's output,
and when any expression names a metric a live gateway does not export. Importable on its own
(Grafana → Dashboards → Import) or through the chart's sidecar ConfigMap; `$datasource` picks the
Prometheus data source and `$job` the scrape job(s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "helm/querygate/files/dashboards/querygate.json"
SEL = 'job=~"$job"'
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (expression, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    stack: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def quantiles(metric: str, by: str, filters: str = "") -> list[tuple[str, str]]:
    selector = f"{SEL}{', ' + filters if filters else ''}"
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def rate(metric: str, by: str, filters: str = "", scale: str = "") -> str:
    selector = f"{SEL}{', ' + filters if filters else ''}"
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{RATE}])){scale}"


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Traffic",
        [
            Panel(
                "Answers per second by route",
                [(rate("querygate_requests_total", "route"), "{{route}}")],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Answer latency by route",
                quantiles("querygate_request_duration_seconds", "route"),
                unit="s",
            ),
            Panel(
                "Failed requests by outcome",
                [
                    (
                        rate("querygate_http_requests_total", "outcome", 'outcome!="ok"'),
                        "{{outcome}}",
                    )
                ],
                unit="reqps",
                stack=True,
                description="Every request is counted once; client_error, body_timeout, "
                "shed_tenant, rate_limited, budget_exceeded and disconnect (the client hung up) "
                "are the client's doing and left out of the availability SLO; the rest are ours, "
                "cancelled included (cancelled by the gateway with the client still connected, "
                "e.g. a drain past its grace).",
            ),
            Panel(
                "In flight and queued",
                [
                    (f"sum(querygate_inflight_requests{{{SEL}}})", "in flight"),
                    (f"sum by (pool) (querygate_admission_inflight{{{SEL}}})", "admitted {{pool}}"),
                    (f"sum by (pool) (querygate_admission_queued{{{SEL}}})", "queued {{pool}}"),
                ],
            ),
        ],
    ),
    (
        "Routing",
        [
            Panel(
                "Route decisions by reason",
                [
                    (
                        rate("querygate_route_decisions_total", "route, reason"),
                        "{{route}} ({{reason}})",
                    )
                ],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Escalations",
                [
                    (
                        rate("querygate_escalations_total", "from_route, to_route, reason"),
                        "{{from_route}} → {{to_route}} ({{reason}})",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Stage latency p95",
                [quantiles("querygate_stage_duration_seconds", "stage")[1]],
                unit="s",
                description="Where an answer's time goes: rewrite, cache lookup, embed, classify, "
                "retrieve, agent, generate, ...",
            ),
            Panel(
                "Agent steps and caps",
                [
                    *quantiles("querygate_agent_steps", "job")[:2],
                    (rate("querygate_agent_cap_hits_total", "cap"), "cap hit: {{cap}}"),
                ],
            ),
            Panel(
                "Retrieval latency",
                quantiles("querygate_retrieval_duration_seconds", "backend"),
                unit="s",
            ),
            Panel(
                "Rerank decisions",
                [(rate("querygate_rerank_total", "decision"), "{{decision}}")],
                unit="reqps",
                stack=True,
                description="Per search: reranked, or why not (off, few hits, a confident "
                "fused ranking); failed keeps the fused order (docs/reranking.md)",
            ),
            Panel(
                "Reranker latency",
                quantiles("querygate_rerank_duration_seconds", "reranker"),
                unit="s",
            ),
        ],
    ),
    (
        "Cache",
        [
            Panel(
                "Cache lookups by result",
                [(rate("querygate_cache_lookups_total", "result"), "{{result}}")],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Cache hit ratio",
                [
                    (
                        rate("querygate_cache_lookups_total", "job", 'result=~"exact|semantic"')
                        + " / "
                        + rate("querygate_cache_lookups_total", "job"),
                        "hit ratio",
                    )
                ],
                unit="percentunit",
            ),
            Panel(
                "Nearest cached question's similarity",
                quantiles("querygate_cache_nearest_similarity", "job"),
                unit="short",
                description="Per semantic lookup, hit or not: tune the thresholds from it.",
            ),
            Panel(
                "Semantic hits refused by a guard",
                [(rate("querygate_cache_guard_refusals_total", "guard"), "{{guard}}")],
                unit="reqps",
            ),
        ],
    ),
    (
        "Models and cost",
        [
            Panel(
                "Model spend (USD per hour) by route and tier",
                [
                    (
                        rate("querygate_llm_cost_usd_total", "route, tier", scale=" * 3600"),
                        "{{route}} / {{tier}}",
                    )
                ],
                unit="currencyUSD",
                stack=True,
            ),
            Panel(
                "Tokens per second by tier",
                [(rate("querygate_llm_tokens_total", "tier, direction"), "{{tier}} {{direction}}")],
            ),
            Panel(
                "Model calls by outcome",
                [
                    (
                        rate("querygate_llm_requests_total", "tier, model, outcome"),
                        "{{tier}} {{model}} {{outcome}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Models cooled down",
                [
                    (
                        f"max by (tier, model) (querygate_llm_cooldown_open{{{SEL}}})",
                        "{{tier}} {{model}}: everyone",
                    ),
                    (
                        f"sum by (tier, model) (querygate_llm_tenant_cooldowns{{{SEL}}})",
                        "{{tier}} {{model}}: tenants alone",
                    ),
                ],
                description="Everyone: 1 while a model is skipped for every tenant after repeated "
                "failures of several tenants' calls. Tenants alone: how many tenants the model is "
                "skipped for because of their own calls' failures (the others still use it).",
            ),
        ],
    ),
    (
        "Index freshness",
        [
            Panel(
                "Time since each tenant's index last changed",
                [
                    (
                        "time() - max by (tenant) "
                        f"(querygate_index_last_write_timestamp_seconds{{{SEL}}})",
                        "{{tenant}}",
                    ),
                    (
                        "max by (tenant) "
                        f"(querygate_index_expect_writes_within_seconds{{{SEL}}} > 0)",
                        "{{tenant}} expected within",
                    ),
                ],
                unit="s",
                description="Against tenants[].expect_writes_within_s where it is set: a line "
                "above its expectation is a source that stopped syncing "
                "(QuerygateIndexStale, docs/runbook.md).",
            ),
            Panel(
                "Documents per tenant",
                [(f"max by (tenant) (querygate_index_documents{{{SEL}}})", "{{tenant}}")],
                description="What each tenant's serving index holds; a reindex keeps it level.",
            ),
        ],
    ),
    (
        "Tenants' quotas",
        [
            Panel(
                "Quota refusals by reason",
                [(rate("querygate_quota_refusals_total", "reason"), "{{reason}}")],
                unit="reqps",
            ),
            Panel(
                "Shared quota store degraded",
                [(f"max(querygate_quota_store_degraded{{{SEL}}})", "degraded")],
                description="1 while Redis is unreachable and limits hold per process.",
            ),
        ],
    ),
    (
        "Configuration and health",
        [
            Panel(
                "Active configuration version",
                [(f"max by (version) (querygate_config_info{{{SEL}}}) == 1", "{{version}}")],
                kind="table",
                # Only value 1 is a version in use (gateway/obs/metrics.py exports no other, but a
                # version replaced in a single process may linger at 0 in an older gateway).
                description="The configuration version(s) some worker runs now (more than one "
                "while a reload or rollout is under way).",
                extra={"options": {"showHeader": True}},
            ),
            Panel(
                "Config reloads by result",
                [
                    (
                        "sum by (result) "
                        f"(increase(querygate_config_reloads_total{{{SEL}}}[{RATE}]))",
                        "{{result}}",
                    )
                ],
            ),
            Panel(
                "Dependencies up",
                [(f"min by (dependency) (querygate_dependency_up{{{SEL}}})", "{{dependency}}")],
            ),
            Panel(
                "Workers serving per pod",
                [
                    (
                        f'max by (instance) (querygate_workers{{{SEL}, state="serving"}})',
                        "{{instance}} serving",
                    ),
                    (
                        f'max by (instance) (querygate_workers{{{SEL}, state="expected"}})',
                        "{{instance}} expected",
                    ),
                ],
                description="Worker processes alive and ready in each pod, against --workers N: "
                "fewer while one is replaced, for long when one cannot start (the log says why).",
            ),
            # Per pod (a scrape of a pod sums its workers): what its resources and the HPA's
            # CPU target are set against. Two panels: bytes and cores share no axis.
            Panel(
                "Resident memory per pod",
                [(f"sum by (instance) (process_resident_memory_bytes{{{SEL}}})", "{{instance}}")],
                unit="bytes",
                description="Against the pod's resources.limits.memory (the OOM kill).",
            ),
            Panel(
                "CPU per pod",
                [
                    (
                        f"sum by (instance) (rate(process_cpu_seconds_total{{{SEL}}}[{RATE}]))",
                        "{{instance}}",
                    )
                ],
                unit="short",
                description="Cores used, against resources.requests.cpu (the HPA's base).",
            ),
        ],
    ),
]


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": expr,
                "legendFormat": legend,
                **({"format": "table", "instant": True} if panel.kind == "table" else {}),
            }
            for i, (expr, legend) in enumerate(panel.targets)
        ],
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "custom": {"stacking": {"mode": "normal" if panel.stack else "none"}},
            },
            "overrides": [],
        },
        **panel.extra,
    }
    return body


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, panel in enumerate(row_panels):
            panels.append(panel_json(panel, len(panels) + 1, 12 * (i % 2), y + 8 * (i // 2)))
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "title": "querygate",
        "uid": "querygate-overview",
        "description": "querygate: traffic, routing, cache, models and cost, quotas, health.",
        "tags": ["querygate"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                },
                {
                    "name": "job",
                    "label": "Job",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(querygate_config_info, job)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
