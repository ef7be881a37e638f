"""Route policy: turns the classifier's opinion and the request into the route we execute."""

from __future__ import annotations

from dataclasses import dataclass

from routers.features import identifiers_in
from routers.types import Classification, Route


class RouteNotAllowed(Exception):
    """The request forced a route its tenant may not force."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    allow_force_route: bool
    lexical_weight: float
    dense_weight: float
    identifier_lexical_weight: float
    # Routes this deployment can execute; a decision for any other falls back, said so.
    executable: frozenset[Route] = frozenset({Route.DIRECT, Route.LOOKUP})


@dataclass(frozen=True, slots=True)
class RouteDecision:
    route: Route
    # A short tag from a closed set, safe as a metric label.
    reason: str
    # What a person reads in `route_reason`: the tag plus the classifier's evidence.
    explanation: str
    classification: Classification
    lexical_weight: float
    dense_weight: float
    # The route the classifier wanted when the policy could not execute it.
    wanted: Route | None = None


def decide(
    classification: Classification, requested: str, query: str, config: PolicyConfig
) -> RouteDecision:
    route, reason = classification.route, "classifier"
    if requested != "auto":
        if not config.allow_force_route:
            raise RouteNotAllowed(f"this tenant may not force the route {requested!r}")
        route, reason = Route(requested), "forced"
    wanted = None
    if route not in config.executable:
        wanted, route, reason = route, Route.LOOKUP, f"{route.value}_unavailable"
    lexical = config.lexical_weight
    identifiers = identifiers_in(query)
    if identifiers and route is not Route.DIRECT:
        lexical = max(lexical, config.identifier_lexical_weight)
    return RouteDecision(
        route=route,
        reason=reason,
        explanation=_explain(classification, reason, wanted, identifiers),
        classification=classification,
        lexical_weight=lexical,
        dense_weight=config.dense_weight,
        wanted=wanted,
    )


def _explain(
    classification: Classification, reason: str, wanted: Route | None, identifiers: list[str]
) -> str:
    parts = [
        f"{reason}: classifier said {classification.route.value} "
        f"(confidence {classification.confidence:.2f}"
        + (f"; {', '.join(classification.reasons)}" if classification.reasons else "")
        + ")"
    ]
    if wanted is not None:
        parts.append(
            f"the {wanted.value} route is not available in this deployment, answered by lookup"
        )
    if identifiers:
        parts.append(f"identifiers {', '.join(identifiers[:5])} raise the lexical weight")
    return "; ".join(parts)
