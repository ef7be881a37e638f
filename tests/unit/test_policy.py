import pytest

from routers.policy import PolicyConfig, RouteNotAllowed, decide
from routers.types import Classification, Route

POLICY = PolicyConfig(
    allow_force_route=True, lexical_weight=1.0, dense_weight=1.0, identifier_lexical_weight=2.5
)


def lookup(confidence: float = 0.8) -> Classification:
    return Classification(Route.LOOKUP, confidence, ("feature:entities",))


def test_classifier_route_is_kept_when_executable() -> None:
    decision = decide(lookup(), "auto", "who wrote Hamlet?", POLICY)
    assert decision.route is Route.LOOKUP
    assert decision.reason == "classifier"
    assert "feature:entities" in decision.explanation


def test_multihop_without_an_agent_is_answered_by_lookup_and_says_so() -> None:
    classification = Classification(Route.MULTIHOP, 0.9, ("feature:compare",))
    decision = decide(classification, "auto", "compare a and b", POLICY)
    assert decision.route is Route.LOOKUP
    assert decision.wanted is Route.MULTIHOP
    assert decision.reason == "multihop_unavailable"
    assert "multihop route is not available" in decision.explanation


def test_forced_route_wins_over_the_classifier() -> None:
    decision = decide(lookup(), "direct", "who wrote Hamlet?", POLICY)
    assert decision.route is Route.DIRECT
    assert decision.reason == "forced"


def test_forcing_is_refused_for_a_tenant_not_allowed_to() -> None:
    policy = PolicyConfig(False, 1.0, 1.0, 2.5)
    with pytest.raises(RouteNotAllowed):
        decide(lookup(), "lookup", "q", policy)


def test_identifiers_raise_the_lexical_weight() -> None:
    decision = decide(lookup(), "auto", "what does ERR-4471 mean?", POLICY)
    assert decision.lexical_weight == 2.5
    assert "ERR-4471" in decision.explanation
    plain = decide(lookup(), "auto", "what does this error mean?", POLICY)
    assert plain.lexical_weight == 1.0
