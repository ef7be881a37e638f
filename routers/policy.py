"""Route policy: the classifier's opinion, the request and the configured rules → one route.

Order, each step able to override the one before:
1. the classifier;
2. per-route confidence thresholds, and no direct answer for a question naming an identifier;
3. direct only for small talk (`routers.small_talk`): a message of that closed set the classifier
   did not call direct is answered directly, anything else it called direct goes to lookup;
4. the first matching configured rule;
5. a route forced by the request (when the tenant may force);
6. identifiers, or a query written as keywords rather than a question, raise the lexical
   weight (unless a rule set it; `lexical_reason`);
7. a route this deployment cannot execute falls back to lookup, and says so;
8. a lookup or multihop decision the request did not force may become full context: the
   decision says so (`full_context_candidate`), the pipeline reads the tenant's corpus only
   then, and `with_full_context` applies it when the corpus fits the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from routers.features import identifiers_in
from routers.rules import RouterConfig, Rule
from routers.small_talk import small_talk
from routers.types import Classification, Route, RouteDecision


class RouteNotAllowed(Exception):
    """The request forced a route its tenant may not force."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    tenant: str
    allow_force_route: bool
    lexical_weight: float
    dense_weight: float
    identifier_lexical_weight: float
    # Routes this deployment can execute (its executor registry); any other falls back.
    executable: frozenset[Route]
    router: RouterConfig = field(default_factory=RouterConfig)
    # The tenant may be answered from its whole corpus (no per-user access rules).
    whole_corpus_allowed: bool = True


@dataclass(slots=True)
class _Draft:
    route: Route
    reason: str
    notes: list[str]
    lexical: float | None = None
    dense: float | None = None


def decide(
    classification: Classification, requested: str, query: str, config: PolicyConfig
) -> RouteDecision:
    identifiers = identifiers_in(query)
    draft = _Draft(classification.route, "classifier", [_describe(classification)])
    _apply_threshold(draft, classification, config.router)
    if identifiers and draft.route is Route.DIRECT:
        # An error code or SKU is a question about the documents, however chatty it sounds.
        draft.route, draft.reason = Route.LOOKUP, "identifier"
        draft.notes.append("a question naming an identifier is never answered without documents")
    _direct_only_for_small_talk(draft, query, config.executable)
    rule = _first_rule(config, classification, query, identifiers)
    if rule is not None:
        _apply_rule(draft, rule)
    if requested != "auto":
        if not config.allow_force_route:
            raise RouteNotAllowed(f"this tenant may not force the route {requested!r}")
        draft.route, draft.reason = Route(requested), "forced"
        draft.notes.append(f"the request forced {requested}")
    if draft.route is Route.FULL_CONTEXT and Route.FULL_CONTEXT in config.executable:
        # Full context is the corpus's property, not the question's: the pipeline reads the
        # corpus for a candidate and takes it only when it fits and the tenant allows it.
        # Chosen here (a rule), it ran on no corpus at all: a model answering from no source.
        draft.route = Route.LOOKUP
        draft.notes.append("full context is taken only where the whole corpus fits, else lookup")
    lexical = draft.lexical if draft.lexical is not None else config.lexical_weight
    why = lexical_reason(query, identifiers)
    if why and draft.lexical is None and draft.route is not Route.DIRECT:
        lexical = max(lexical, config.identifier_lexical_weight)
        draft.notes.append(f"{why} raise the lexical weight")
    wanted = None
    if draft.route not in config.executable:
        wanted = draft.route
        draft.notes.append(
            f"the {wanted.value} route is not available in this deployment, answered by lookup"
        )
        draft.route, draft.reason = Route.LOOKUP, f"{wanted.value}_unavailable"
    candidate = (
        requested == "auto"
        and config.whole_corpus_allowed
        and Route.FULL_CONTEXT in config.executable
        and draft.route in (Route.LOOKUP, Route.MULTIHOP)
    )
    return RouteDecision(
        route=draft.route,
        reason=draft.reason,
        explanation=_explanation(draft),
        classification=classification,
        lexical_weight=lexical,
        dense_weight=draft.dense if draft.dense is not None else config.dense_weight,
        wanted=wanted,
        full_context_candidate=candidate,
    )


def needs_classification(requested: str, executable: frozenset[Route]) -> bool:
    """False when the request forces the direct route this deployment executes: no rule,
    threshold or classifier output can change a forced route, and direct needs no retrieval
    weights, so the query's embedding (the dearest step of such a request: docs/benchmarks.md)
    and the classifier are not paid for."""
    return not (requested == Route.DIRECT.value and Route.DIRECT in executable)


def decide_forced_direct(config: PolicyConfig) -> RouteDecision:
    """`decide` for a request that forces direct, without classifying it (see
    `needs_classification`): the same route, reason and refusal, no classifier evidence."""
    if not config.allow_force_route:
        raise RouteNotAllowed(f"this tenant may not force the route {Route.DIRECT.value!r}")
    return RouteDecision(
        route=Route.DIRECT,
        reason="forced",
        explanation="forced: the request forced direct (not classified)",
        classification=_NOT_CLASSIFIED,
        lexical_weight=config.lexical_weight,
        dense_weight=config.dense_weight,
    )


_NOT_CLASSIFIED = Classification(Route.DIRECT, 1.0, ("not_classified",))


# A query that opens with one of these (within its first three words) or holds a '?' is a
# question; any other is keywords ("ERR-4471 upstream certificate", "1887 Gustave").
_QUESTION_WORDS = frozenset(
    "who whom whose what which when where why how is are was were do does did can could "
    "should would will has have had name list tell give explain describe".split()
)


def lexical_reason(query: str, identifiers: list[str] | None = None) -> str | None:
    """Why BM25 should count for more on this query, or None: it names identifiers, or it is
    written as keywords rather than a question (a keyword search is a lexical search). The
    policy then raises the lexical weight to `identifier_lexical_weight`; bench/retrieval_eval.py
    measures both signals (docs/opensearch.md, "Fusion")."""
    found = identifiers_in(query) if identifiers is None else identifiers
    if found:
        return f"identifiers {', '.join(found[:5])}"
    words = query.split(maxsplit=3)[:3]
    if words and "?" not in query and not any(_word(w) in _QUESTION_WORDS for w in words):
        return "a keyword query (no question word)"
    return None


def _word(token: str) -> str:
    return token.strip(".,;:!\"'()[]").casefold()


def with_full_context(decision: RouteDecision) -> RouteDecision:
    """The decision once the tenant's whole corpus was found to fit the context budget."""
    return replace(
        decision,
        route=Route.FULL_CONTEXT,
        reason="full_context",
        explanation=f"full_context: {decision.explanation}; "
        "the tenant's whole corpus fits the context budget",
        full_context_candidate=False,
    )


def _explanation(draft: _Draft) -> str:
    notes = "; ".join(draft.notes)
    # The classifier's own note already says so; any other deciding step is named first.
    return notes if draft.reason == "classifier" else f"{draft.reason}: {notes}"


def _describe(classification: Classification) -> str:
    evidence = f"; {', '.join(classification.reasons)}" if classification.reasons else ""
    return (
        f"classifier said {classification.route.value} "
        f"(confidence {classification.confidence:.2f}{evidence})"
    )


def _apply_threshold(draft: _Draft, classification: Classification, router: RouterConfig) -> None:
    threshold = router.thresholds.get(classification.route)
    if threshold is not None and classification.confidence < threshold:
        draft.route, draft.reason = Route.LOOKUP, "below_threshold"
        draft.notes.append(
            f"confidence under the {classification.route.value} threshold {threshold:.2f}"
        )


def _direct_only_for_small_talk(draft: _Draft, query: str, executable: frozenset[Route]) -> None:
    """A wrong direct answer loses the documents' grounding, a needless lookup costs a
    retrieval: so direct is kept for the closed set that needs no documents, and that set goes
    direct whatever the classifier's opinion (not when a threshold or an identifier
    already sent the message to lookup)."""
    kind = small_talk(query)
    if draft.route is Route.DIRECT and kind is None and Route.LOOKUP in executable:
        draft.route, draft.reason = Route.LOOKUP, "needs_documents"
        draft.notes.append(
            "not small talk (greetings, thanks, the conversation, text to transform): "
            "answered from the documents"
        )
    elif draft.reason == "classifier" and draft.route is not Route.DIRECT and kind is not None:
        draft.route, draft.reason = Route.DIRECT, "small_talk"
        draft.notes.append(f"small talk ({kind}) needs no documents")


def _first_rule(
    config: PolicyConfig, classification: Classification, query: str, identifiers: list[str]
) -> Rule | None:
    for rule in config.router.rules:
        if _matches(rule, config.tenant, classification, query, bool(identifiers)):
            return rule
    return None


def _matches(
    rule: Rule, tenant: str, classification: Classification, query: str, has_ids: bool
) -> bool:
    when = rule.when
    return (
        (not when.tenants or tenant in when.tenants)
        and (not when.routes or classification.route in when.routes)
        and when.query_matches(query)
        and when.min_confidence <= classification.confidence <= when.max_confidence
        and (when.has_identifiers is None or when.has_identifiers == has_ids)
    )


def decision_labels(router: RouterConfig) -> list[tuple[str, str]]:
    """Every (route, reason) a decision of this configuration can be counted under (the
    `querygate_route_decisions` labels): the classifier's and a forced route on every route,
    lookup's own reasons and its stand-in for an unavailable route, small talk's, the whole
    corpus's, and each rule that sets a route."""
    pairs = [(route.value, reason) for route in Route for reason in ("classifier", "forced")]
    lookup = ["identifier", "below_threshold", "needs_documents"]
    lookup += [f"{route.value}_unavailable" for route in Route if route is not Route.LOOKUP]
    pairs += [(Route.LOOKUP.value, reason) for reason in lookup]
    pairs += [(Route.DIRECT.value, "small_talk"), (Route.FULL_CONTEXT.value, "full_context")]
    for rule in router.rules:
        if rule.then.route is not None:
            pairs.append((rule.then.route.value, f"rule:{rule.name}"))
    return pairs


def _apply_rule(draft: _Draft, rule: Rule) -> None:
    action = rule.then
    if action.route is not None:
        draft.route, draft.reason = action.route, f"rule:{rule.name}"
    draft.lexical = action.lexical_weight
    draft.dense = action.dense_weight
    draft.notes.append(f"rule {rule.name} matched")
