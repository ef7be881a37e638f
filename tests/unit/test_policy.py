import pytest
from pydantic import ValidationError

from routers.policy import PolicyConfig, RouteNotAllowed, decide, lexical_reason, with_full_context
from routers.rules import RouterConfig, Rule
from routers.types import Classification, Route

NO_AGENT = frozenset({Route.DIRECT, Route.LOOKUP})


def policy(
    router: RouterConfig | None = None,
    allow_force: bool = True,
    executable: frozenset[Route] = NO_AGENT,
    whole_corpus_allowed: bool = True,
) -> PolicyConfig:
    return PolicyConfig(
        tenant="acme",
        allow_force_route=allow_force,
        lexical_weight=1.0,
        dense_weight=1.0,
        identifier_lexical_weight=2.5,
        executable=executable,
        router=router or RouterConfig(),
        whole_corpus_allowed=whole_corpus_allowed,
    )


def classified(route: Route = Route.LOOKUP, confidence: float = 0.8) -> Classification:
    return Classification(route, confidence, ("feature:entities",))


def rules(*specs: dict[str, object]) -> RouterConfig:
    return RouterConfig.model_validate({"rules": list(specs)})


def test_classifier_route_is_kept_when_executable() -> None:
    decision = decide(classified(), "auto", "who wrote Hamlet?", policy())
    assert decision.route is Route.LOOKUP
    assert decision.reason == "classifier"
    assert "feature:entities" in decision.explanation


def test_multihop_without_an_agent_is_answered_by_lookup_and_says_so() -> None:
    decision = decide(classified(Route.MULTIHOP, 0.9), "auto", "compare a and b", policy())
    assert decision.route is Route.LOOKUP
    assert decision.wanted is Route.MULTIHOP
    assert decision.reason == "multihop_unavailable"
    assert "multihop route is not available" in decision.explanation


def test_forced_route_wins_over_classifier_and_rules() -> None:
    router = rules({"name": "all-lookup", "then": {"route": "lookup"}})
    decision = decide(classified(Route.DIRECT), "direct", "hi", policy(router))
    assert decision.route is Route.DIRECT
    assert decision.reason == "forced"


def test_forcing_is_refused_for_a_tenant_not_allowed_to() -> None:
    with pytest.raises(RouteNotAllowed):
        decide(classified(), "lookup", "q", policy(allow_force=False))


def test_identifiers_raise_the_lexical_weight() -> None:
    decision = decide(classified(), "auto", "what does ERR-4471 mean?", policy())
    assert decision.lexical_weight == 2.5
    assert "ERR-4471" in decision.explanation
    assert decide(classified(), "auto", "what does it mean?", policy()).lexical_weight == 1.0


@pytest.mark.parametrize(
    ("query", "raised"),
    [
        ("1887 Gustave", True),  # keywords: a lexical search
        ("upstream certificate expired", True),
        ("Eiffel Tower designer", True),
        ("Who designed the Eiffel Tower?", False),
        ("In what year was the Eiffel Tower built", False),  # a question word among the first 3
        ("the tower's designer?", False),  # a question mark
    ],
)
def test_a_keyword_query_raises_the_lexical_weight(query: str, raised: bool) -> None:
    decision = decide(classified(), "auto", query, policy())
    assert decision.lexical_weight == (2.5 if raised else 1.0)
    assert ("keyword query" in decision.explanation) is raised
    assert (lexical_reason(query) is not None) is raised


def test_low_confidence_direct_falls_back_to_lookup() -> None:
    router = RouterConfig.model_validate({"thresholds": {"direct": 0.7}})
    decision = decide(classified(Route.DIRECT, 0.6), "auto", "ok so", policy(router))
    assert decision.route is Route.LOOKUP
    assert decision.reason == "below_threshold"
    confident = decide(classified(Route.DIRECT, 0.9), "auto", "hello", policy(router))
    assert confident.route is Route.DIRECT


def test_first_matching_rule_wins_and_names_itself() -> None:
    router = rules(
        {"name": "other-tenant", "when": {"tenants": ["globex"]}, "then": {"route": "direct"}},
        {"name": "invoices", "when": {"query_regex": "(?i)invoice"}, "then": {"route": "direct"}},
        {"name": "catch-all", "then": {"route": "lookup"}},
    )
    decision = decide(classified(), "auto", "Where is my INVOICE?", policy(router))
    assert decision.route is Route.DIRECT
    assert decision.reason == "rule:invoices"


def test_a_rule_can_set_retrieval_weights() -> None:
    router = rules(
        {"name": "codes", "when": {"has_identifiers": True}, "then": {"lexical_weight": 4.0}}
    )
    decision = decide(classified(), "auto", "ERR-4471?", policy(router))
    assert (decision.lexical_weight, decision.reason) == (4.0, "classifier")


@pytest.mark.parametrize(
    ("router", "path"),
    [
        ({"rules": [{"name": "x", "then": {"route": "teleport"}}]}, "rules.0.then.route"),
        ({"rules": [{"name": "x", "when": {"query_regex": "(a"}, "then": {}}]}, "query_regex"),
        ({"thresholds": {"direct": 1.5}}, "thresholds"),
        ({"rules": [{"name": "Bad Name", "then": {}}]}, "rules.0.name"),
    ],
)
def test_invalid_rules_are_refused_naming_the_path(router: dict[str, object], path: str) -> None:
    with pytest.raises(ValidationError) as info:
        RouterConfig.model_validate(router)
    located = [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]
    assert any(path in loc for loc in located), located


def test_rule_names_must_be_unique() -> None:
    with pytest.raises(ValidationError, match="unique"):
        rules({"name": "a", "then": {}}, {"name": "a", "then": {}})


def test_rule_type_is_exported() -> None:
    assert Rule.model_validate({"name": "ok", "then": {}}).when.tenants == ()


def test_a_question_naming_an_identifier_never_goes_direct() -> None:
    # Seen in CI: the learned classifier called "What does error ZX-F92A8D mean for the Acme
    # fan?" direct (p=0.77), which would answer a document question without the documents.
    text = "What does error ZX-F92A8D mean for the Acme fan?"
    decision = decide(classified(Route.DIRECT, 0.77), "auto", text, policy())
    assert (decision.route, decision.reason) == (Route.LOOKUP, "identifier")
    assert "ZX-F92A8D" in decision.explanation


def test_a_forced_direct_route_still_wins_over_the_identifier_guard() -> None:
    decision = decide(classified(Route.DIRECT, 0.77), "direct", "thanks for ERR-4471", policy())
    assert decision.route is Route.DIRECT


def test_multihop_is_kept_where_the_registry_can_execute_it() -> None:
    config = policy(executable=NO_AGENT | {Route.MULTIHOP})
    decision = decide(classified(Route.MULTIHOP, 0.9), "auto", "compare a and b", config)
    assert decision.route is Route.MULTIHOP
    assert decision.wanted is None


ALL_ROUTES = frozenset(Route)


@pytest.mark.parametrize("route", [Route.LOOKUP, Route.MULTIHOP])
def test_full_context_is_a_candidate_only_where_it_is_executable_and_allowed(route: Route) -> None:
    question = classified(route, 0.9)
    assert decide(question, "auto", "q", policy(executable=ALL_ROUTES)).full_context_candidate
    assert not decide(question, "auto", "q", policy()).full_context_candidate
    refused = policy(executable=ALL_ROUTES, whole_corpus_allowed=False)
    assert not decide(question, "auto", "q", refused).full_context_candidate
    forced = decide(question, route.value, "q", policy(executable=ALL_ROUTES))
    assert not forced.full_context_candidate


def test_a_direct_decision_is_never_a_full_context_candidate() -> None:
    decision = decide(classified(Route.DIRECT, 0.9), "auto", "hello", policy(executable=ALL_ROUTES))
    assert not decision.full_context_candidate


def test_with_full_context_names_itself_and_keeps_the_evidence() -> None:
    decision = decide(classified(), "auto", "who wrote Hamlet?", policy(executable=ALL_ROUTES))
    promoted = with_full_context(decision)
    assert promoted.route is Route.FULL_CONTEXT
    assert promoted.reason == "full_context"
    assert "feature:entities" in promoted.explanation
    assert "fits the context budget" in promoted.explanation


def test_a_rule_naming_full_context_makes_a_candidate_never_a_route_without_a_corpus() -> None:
    router = rules({"name": "whole", "then": {"route": "full_context"}})
    decision = decide(classified(), "auto", "q", policy(router, executable=ALL_ROUTES))
    assert decision.route is Route.LOOKUP  # until the corpus is read and fits
    assert decision.full_context_candidate
    assert decision.reason == "rule:whole"
    refused = policy(router, executable=ALL_ROUTES, whole_corpus_allowed=False)
    decision = decide(classified(), "auto", "q", refused)
    assert decision.route is Route.LOOKUP and not decision.full_context_candidate
    unavailable = decide(classified(), "auto", "q", policy(router))
    assert unavailable.route is Route.LOOKUP
    assert unavailable.reason == "full_context_unavailable"
