"""Write the alert rules the chart ships: helm/querygate/files/alerts/querygate.yaml.

The rules are code: change the SLO targets, windows, outcome lists or alerts here, run
`python scripts/make_alerts.py`, commit both (and docs/runbook.md when a target moves).
tests/integration/test_dashboard_and_alerts.py fails when the YAML is not this script's output,
and runs promtool's unit tests of the alerts (tests/alerts/querygate_test.yaml). The output stays
a plain Prometheus rule file (`groups:`); the chart wraps its groups in a PrometheusRule and
rewrites the relative `runbook_url`s against `metrics.prometheusRule.runbookBaseUrl`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "helm/querygate/files/alerts/querygate.yaml"
RUNBOOK = "docs/runbook.md"

# The answering endpoints (gateway/obs/accounting.py ANSWERING; a test keeps the two equal).
ANSWERING_ENDPOINTS = ("POST /v1/query", "POST /v1/chat/completions", "POST /v1/completions")
# Every outcome of an answering request falls in exactly one of these (or is `ok`); a test checks
# the partition. Ours count against the availability SLO. `cancelled` is ours: the middleware
# says `cancelled` when the handler was cancelled with the client still connected (e.g. a drain
# past server.shutdown_grace_s); a client that hung up is `disconnect`.
OUR_FAILURES = ("error", "unavailable", "upstream_error", "deadline", "shed_process", "cancelled")
# The client's doing: malformed, too slow sending its body, over its share, rate or budget, or gone.
CLIENT_CAUSED = (
    "client_error",
    "body_timeout",
    "shed_tenant",
    "rate_limited",
    "budget_exceeded",
    "disconnect",
)

# SLOs over 30 days.
AVAILABILITY_TARGET = 0.995
LATENCY_TARGET = 0.99
# Per final route: the answer time the latency SLO holds it to. Each is a bucket bound of
# querygate_request_duration_seconds (gateway/obs/metrics.py; a test checks it).
LATENCY_TARGETS_S = {"direct": 2.5, "lookup": 5.0, "full_context": 10.0, "multihop": 30.0}


class Burn:
    """One multi-window burn-rate condition: both windows over `factor` x the error budget."""

    def __init__(self, factor: float, long: str, short: str) -> None:
        self.factor, self.long, self.short = factor, long, short


# Google SRE workbook, "Alerting on SLOs", multiwindow multi-burn-rate: page at 14.4x (1h, 5m)
# or 6x (6h, 30m), ticket at 3x (1d, 2h) or 1x (3d, 6h).
PAGE = (Burn(14.4, "1h", "5m"), Burn(6, "6h", "30m"))
TICKET = (Burn(3, "1d", "2h"), Burn(1, "3d", "6h"))
_ORDER = {"m": 60, "h": 3600, "d": 86400}
WINDOWS = sorted(
    {w for burn in (*PAGE, *TICKET) for w in (burn.long, burn.short)},
    key=lambda w: int(w[:-1]) * _ORDER[w[-1]],
)

LONG_WINDOWS = sorted({burn.long for burn in (*PAGE, *TICKET)}, key=WINDOWS.index)
# A burn-rate alert also needs this many bad answers (failed, or slow for the route) in its long
# window: at 12 answers an hour one failure is 8% of the hour, over the fast burn's 7.2%, and
# a single flaky request would page. A total outage at that traffic still pages within ~25 min
# (and QuerygateDown or a dependency alert usually first).
MIN_BAD_ANSWERS = 5

AVAILABILITY_RECORD = "querygate:availability_errors:ratio_rate"
LATENCY_RECORD = "querygate:latency_slow:ratio_rate"
AVAILABILITY_COUNT = "querygate:availability_errors:increase"
LATENCY_COUNT = "querygate:latency_slow:increase"


def number(value: float) -> str:
    """A constant as PromQL reads it, without float noise (1 - 0.995 is 0.0050000000000000044)."""
    return format(round(value, 10), "g")


def percent(target: float) -> str:
    return number(target * 100) + "%"


def _endpoints() -> str:
    paths = [e.removeprefix("POST /v1/") for e in ANSWERING_ENDPOINTS]
    return f'endpoint=~"POST /v1/({"|".join(paths)})"'


def availability_ratio(window: str) -> str:
    total = "querygate_http_requests_total"
    return (
        f"sum by (job) (rate({total}{{{_endpoints()}, "
        f'outcome=~"{"|".join(OUR_FAILURES)}"}}[{window}]))\n'
        "/\n"
        f"sum by (job) (rate({total}{{{_endpoints()}, "
        f'outcome!~"{"|".join(CLIENT_CAUSED)}"}}[{window}]))\n'
    )


def availability_errors(window: str) -> str:
    """How many answers failed in `window` (the ratio's numerator, counted)."""
    return (
        "sum by (job) (increase(querygate_http_requests_total"
        f'{{{_endpoints()}, outcome=~"{"|".join(OUR_FAILURES)}"}}[{window}]))\n'
    )


def _fast(function: str, window: str) -> str:
    return "\n  or\n".join(
        f"  sum by (job, route) ({function}(querygate_request_duration_seconds_bucket"
        f'{{route="{route}", le="{bound!r}"}}[{window}]))'
        for route, bound in LATENCY_TARGETS_S.items()
    )


def latency_ratio(window: str) -> str:
    return (
        f"1 - (\n{_fast('rate', window)}\n)\n/\n"
        f"sum by (job, route) (rate(querygate_request_duration_seconds_count[{window}]))\n"
    )


def latency_slow(window: str) -> str:
    """How many answers of each route took longer than its target in `window`."""
    return (
        f"sum by (job, route) (increase(querygate_request_duration_seconds_count[{window}]))\n"
        f"-\n(\n{_fast('increase', window)}\n)\n"
    )


def burn_expr(record: str, count: str, budget: float, burns: tuple[Burn, ...]) -> str:
    def over(burn: Burn) -> str:
        limit = (
            number(budget) if burn.factor == 1 else f"({number(burn.factor)} * {number(budget)})"
        )
        return (
            f"(\n  {record}{burn.long} > {limit}\n  and {record}{burn.short} > {limit}\n"
            f"  and {count}{burn.long} >= {MIN_BAD_ANSWERS}\n)"
        )

    return "\nor\n".join(over(burn) for burn in burns) + "\n"


def alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr if expr.endswith("\n") else expr + "\n",
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": _Quoted(summary),
            "description": _Quoted(description),
            "runbook_url": f"{RUNBOOK}#{name.lower()}",
        },
    }


def slo_alerts() -> list[dict[str, Any]]:
    budget_a = 1 - AVAILABILITY_TARGET
    budget_l = 1 - LATENCY_TARGET
    failing = (
        "{{ $labels.job }}: {{ $value | humanizePercentage }} of answering requests fail "
        f"(SLO {percent(AVAILABILITY_TARGET)})."
    )
    slow = (
        "{{ $labels.job }}: {{ $value | humanizePercentage }} of {{ $labels.route }} answers "
        f"exceed the route's latency target (SLO {percent(LATENCY_TARGET)})."
    )
    return [
        alert(
            "QuerygateAvailabilityBurnFast",
            burn_expr(AVAILABILITY_RECORD, AVAILABILITY_COUNT, budget_a, PAGE),
            "2m",
            "page",
            "querygate is failing answers fast enough to spend a month's error budget in days",
            failing,
        ),
        alert(
            "QuerygateAvailabilityBurnSlow",
            burn_expr(AVAILABILITY_RECORD, AVAILABILITY_COUNT, budget_a, TICKET),
            "15m",
            "ticket",
            "querygate's failed answers are eating the error budget",
            failing,
        ),
        alert(
            "QuerygateLatencyBurnFast",
            burn_expr(LATENCY_RECORD, LATENCY_COUNT, budget_l, PAGE),
            "2m",
            "page",
            "{{ $labels.route }} answers are too slow, fast enough to spend the latency budget "
            "in days",
            slow,
        ),
        alert(
            "QuerygateLatencyBurnSlow",
            burn_expr(LATENCY_RECORD, LATENCY_COUNT, budget_l, TICKET),
            "15m",
            "ticket",
            "{{ $labels.route }} answers are slower than their target too often",
            slow,
        ),
    ]


def dependency_alerts() -> list[dict[str, Any]]:
    spend = "sum by (job) (rate(querygate_llm_cost_usd_total[{}])) * 3600"
    refused = 'querygate_config_reloads_total{result="error"}'
    return [
        alert(
            "QuerygateDown",
            # Every pod of the job gone from Prometheus: no request is counted any more, so the
            # SLO alerts above cannot fire. Only querygate's own series: a scrape job (the
            # Service's, or a shared annotation-based one) is not known here.
            "group by (job) (last_over_time(querygate_config_info[1d]))\n"
            "unless\n"
            "group by (job) (querygate_config_info)",
            "5m",
            "page",
            "no querygate pod of {{ $labels.job }} has been scraped for 5 minutes",
            "{{ $labels.job }} exported querygate metrics within the last day and none now: "
            "every pod is down, unready to Prometheus, or out of its reach. Nothing it serves "
            "is counted, so no SLO alert can fire.",
        ),
        alert(
            "QuerygateCostSpike",
            f"{spend.format('15m')}\n  > 3 * {spend.format('1d')}\nand\n{spend.format('15m')} > 1"
            # a day of history: a new deployment's "daily average" is its first hour over 24
            "\nand on (job)\ngroup by (job) (querygate_llm_cost_usd_total offset 1d)",
            "15m",
            "ticket",
            "model spend is over 3x its daily average rate",
            '{{ $labels.job }}: spending {{ $value | printf "%.2f" }} USD/h on models, over 3x '
            "the last day's average (and over 1 USD/h).",
        ),
        alert(
            "QuerygateCacheBackendDown",
            'min by (job) (querygate_dependency_up{dependency="cache"}) == 0',
            "5m",
            "ticket",
            "the response cache backend does not answer; requests are served uncached",
            "{{ $labels.job }}: a worker's cache health probe has failed for 5 minutes. "
            "Answers still flow, at full model cost and latency.",
        ),
        alert(
            "QuerygateRetrievalBackendDown",
            'min by (job) (querygate_dependency_up{dependency="retrieval"}) == 0',
            "2m",
            "page",
            "the retrieval backend does not answer; pods fail /readyz and leave the Service",
            "{{ $labels.job }}: a worker's retrieval health probe has failed for 2 minutes and its "
            "/readyz fails; with a shared OpenSearch every pod's does, and nothing is served.",
        ),
        alert(
            "QuerygateModelTierFailing",
            "max by (job, tier, model) (querygate_llm_cooldown_open) == 1",
            "5m",
            "page",
            "model {{ $labels.model }} ({{ $labels.tier }} tier) keeps failing and is cooled down",
            "{{ $labels.job }}: {{ $labels.model }} has been skipped after repeated failures for "
            "5 minutes; its tier runs on fallbacks or fails with 503.",
        ),
        alert(
            "QuerygateConfigReloadFailing",
            # A process creates the result="error" series at its first refusal, at 1: increase()
            # sees no change in a series that was not there before, so a new series counts too.
            f"sum by (job) (\n  (increase({refused}[15m]) > 0)\n  or\n"
            f"  ({refused} unless {refused} offset 15m)\n) > 0",
            "0m",
            "ticket",
            "a configuration change was refused; the previous configuration keeps running",
            "{{ $labels.job }}: {{ $value | humanize }} reload(s) refused in 15 minutes. "
            "The new file is invalid or needs a restart.",
        ),
        alert(
            "QuerygateWorkersMissing",
            # Every worker of a pod reports its supervisor's figures: one series per pod.
            'max by (job, instance) (querygate_workers{state="expected"})\n'
            '  - max by (job, instance) (querygate_workers{state="serving"}) > 0',
            "10m",
            "ticket",
            "a pod serves with fewer workers than configured",
            "{{ $labels.instance }}: {{ $value }} worker(s) missing for 10 minutes: one cannot "
            "start or keeps crashing, and is retried (up to every 30 s) while the others serve.",
        ),
        alert(
            "QuerygateQuotaStoreDegraded",
            "max by (job) (querygate_quota_store_degraded) == 1",
            "5m",
            "ticket",
            "the shared quota store is unreachable; rate limits and budgets are enforced per "
            "process",
            "{{ $labels.job }}: tenants' limits are per worker for now (a tenant can get N "
            "workers x its limit).",
        ),
    ]


def index_alerts() -> list[dict[str, Any]]:
    return [
        alert(
            "QuerygateIndexStale",
            # Only tenants with tenants[].expect_writes_within_s set export a value above 0.
            "time() - max by (job, tenant) (querygate_index_last_write_timestamp_seconds)\n"
            "  > on (job, tenant)\n"
            "max by (job, tenant) (querygate_index_expect_writes_within_seconds > 0)",
            "15m",
            "ticket",
            "a tenant's index has not changed for longer than its source is expected to write",
            "{{ $labels.tenant }}: no change for {{ $value | humanizeDuration }}, past its "
            "expect_writes_within_s. The sync feeding it (ingest, PUTs) has stopped.",
        ),
    ]


def rules() -> dict[str, Any]:
    recording = (
        [{"record": f"{AVAILABILITY_RECORD}{w}", "expr": availability_ratio(w)} for w in WINDOWS]
        + [{"record": f"{LATENCY_RECORD}{w}", "expr": latency_ratio(w)} for w in WINDOWS]
        + [
            {"record": f"{AVAILABILITY_COUNT}{w}", "expr": availability_errors(w)}
            for w in LONG_WINDOWS
        ]
        + [{"record": f"{LATENCY_COUNT}{w}", "expr": latency_slow(w)} for w in LONG_WINDOWS]
    )
    return {
        "groups": [
            {"name": "querygate-slo-recording", "rules": recording},
            {"name": "querygate-slo-alerts", "rules": slo_alerts()},
            {"name": "querygate-dependencies", "rules": dependency_alerts()},
            {"name": "querygate-index", "rules": index_alerts()},
        ]
    }


def _comment(text: str, indent: str = "") -> str:
    """`text` as `#` comment lines of at most 100 characters, continuation lines indented."""
    lines = textwrap.wrap(text, 98 - len(indent), subsequent_indent="  ")
    return "".join(f"# {indent}{line}\n" for line in lines)


def _burns(burns: tuple[Burn, ...]) -> str:
    return " or ".join(f"{number(b.factor)}x ({b.long} and {b.short})" for b in burns)


HEADER = (
    "# querygate's alert rules (a Prometheus rule file; the chart wraps its groups in a\n"
    "# PrometheusRule). GENERATED by scripts/make_alerts.py: edit the script, run it, commit\n"
    "# both.\n"
    "#\n"
    "# SLOs, over 30 days:\n"
    + _comment(
        f"availability: {percent(AVAILABILITY_TARGET)} of answering requests "
        f"({', '.join(ANSWERING_ENDPOINTS)}) succeed; failures are {', '.join(OUR_FAILURES)}; "
        f"left out as the client's doing: {', '.join(CLIENT_CAUSED)};",
        "  ",
    )
    + _comment(
        f"latency, per final route: {percent(LATENCY_TARGET)} answered within "
        + ", ".join(f"{route} {number(s)} s" for route, s in LATENCY_TARGETS_S.items())
        + " (bucket bounds of querygate_request_duration_seconds).",
        "  ",
    )
    + _comment(
        "Burn-rate alerts follow the multi-window, multi-burn-rate recipe of Google's SRE "
        f"workbook: page at {_burns(PAGE)}, ticket at {_burns(TICKET)}, each with at least "
        f"{MIN_BAD_ANSWERS} bad answers in its long window. Every alert links its "
        f"runbook entry ({RUNBOOK}#<alert>, relative: the chart makes it absolute)."
    )
)


class _Quoted(str):
    """A string written in double quotes (annotations: Go templates with quotes and braces)."""


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key; multi-line strings as `|` blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _quoted(dumper: yaml.SafeDumper, value: _Quoted) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style='"')


_Dumper.add_representer(str, _str)
_Dumper.add_representer(_Quoted, _quoted)


def render() -> str:
    body = yaml.dump(rules(), Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)
    return HEADER + body


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
