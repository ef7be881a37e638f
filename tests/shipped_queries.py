"""The PromQL the project ships: every expression of the Grafana dashboard
(helm/querygate/files/dashboards, scripts/make_dashboard.py) and the alert and recording rules
(helm/querygate/files/alerts, scripts/make_alerts.py), and the series selectors each reads, with
their label matchers (parsed with promql_parser: an invalid expression fails here)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser
import yaml

from scripts import make_alerts
from scripts.make_dashboard import OUT as DASHBOARD

RULES = make_alerts.OUT
# Grafana's variables, as Grafana would substitute them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job": ".*"}


@dataclass(frozen=True)
class Selector:
    """One series selector: the metric name and its matchers, (label, op, value) each, op one
    of =, !=, =~, !~."""

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether a sample of this name and labels is one the selector reads (a label the
        sample lacks is "", as in Prometheus)."""
        return name == self.name and all(
            _matches(op, value, labels.get(label, "")) for label, op, value in self.matchers
        )


_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def _matches(op: str, value: str, actual: str) -> bool:
    if op in ("=", "!="):
        return (actual == value) == (op == "=")
    return (re.fullmatch(value, actual) is not None) == (op == "=~")


def selectors(expr: str) -> Iterator[Selector]:
    """The selectors an expression reads, in order."""
    yield from _walk(promql_parser.parse(expr))


def _walk(node: Any) -> Iterator[Selector]:
    if type(node).__name__ == "VectorSelector":
        matchers = tuple(
            (m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value)
            for m in node.matchers.matchers
            if m.name != "__name__"
        )
        yield Selector(node.name, matchers)
        return
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _walk(child)
    for child in getattr(node, "args", None) or ():
        yield from _walk(child)


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["query"].removeprefix("label_values(").split(",")[0])
    out = []
    for expr in exprs:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        out.append(expr)
    return out


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded() -> set[str]:
    """The series the recording rules make (no gateway exports them)."""
    return {rule["record"] for rule in rules() if "record" in rule}
