"""The routing section of the configuration: classifier, thresholds, ordered rules, escalation.

Validated whole at load: an unknown route, a regex that does not compile or a threshold out
of range is refused with the rule's path (e.g. `router.rules.2.when.query_regex`). Rule
regexes are RE2 (linear time on any query).
"""

from __future__ import annotations

import functools
from typing import Literal

import re2
from pydantic import BaseModel, Field, field_validator, model_validator

from backends.sections import SECTION
from routers.types import Route


class RuleMatch(BaseModel):
    """Every condition given must hold; an empty match matches everything."""

    model_config = SECTION

    tenants: tuple[str, ...] = ()
    # The classifier's route.
    routes: tuple[Route, ...] = ()
    query_regex: str | None = None
    min_confidence: float = Field(default=0.0, ge=0, le=1)
    max_confidence: float = Field(default=1.0, ge=0, le=1)
    has_identifiers: bool | None = None

    @field_validator("query_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            _compiled(value)
        return value

    @model_validator(mode="after")
    def _satisfiable(self) -> RuleMatch:
        # Silently never matching is the worst outcome of a typo in a routing rule.
        if self.min_confidence > self.max_confidence:
            raise ValueError(
                f"min_confidence {self.min_confidence:g} is above max_confidence "
                f"{self.max_confidence:g}: the rule could never match"
            )
        return self

    def query_matches(self, query: str) -> bool:
        """query_regex found in the query (None matches everything), in linear time."""
        return self.query_regex is None or _compiled(self.query_regex).search(query) is not None


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the error is raised to the loader, which names the rule
    return options


_RE2_OPTIONS = _re2_options()


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re2._Regexp:
    """A rule's regex runs on every query, on the event loop: in RE2, linear in the query's
    length whatever the pattern (no backtracking). RE2 has no backreferences or lookaround,
    and its \\w, \\d and \\b are ASCII (\\pL is any letter)."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise ValueError(
            f"not a valid regular expression for RE2, the linear-time engine rules run on "
            f"(no backreferences or lookaround): {reason}"
        ) from exc


class RuleAction(BaseModel):
    model_config = SECTION

    route: Route | None = None
    lexical_weight: float | None = Field(default=None, ge=0)
    dense_weight: float | None = Field(default=None, ge=0)


class Rule(BaseModel):
    model_config = SECTION

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    when: RuleMatch = RuleMatch()
    then: RuleAction


class EscalationConfig(BaseModel):
    """When the lookup route's evidence grade says "insufficient", escalate to multihop.

    `routers.grading.assess` grades with the method chosen here; `enabled` decides whether an
    insufficient grade escalates (a lookup with no hits at all says so, grading or not).
    """

    model_config = SECTION

    # On by default: on the held-out dev test part it raises multihop recall over the classifier
    # alone, and out of domain at most 1 of the 10 single-hop questions over tests/data/acme
    # escalates (`bench/escalation_eval.py`; docs/benchmarks.md, "The router, measured"). Its
    # price: a question whose page the corpus lacks escalates too; watch
    # querygate_escalations_total{reason="learned_insufficient"}.
    enabled: bool = True
    # learned: the sufficiency model (routers/sufficiency.py) over both arms, the query and the
    # classifier; signals: the two thresholds below.
    method: Literal["learned", "signals"] = "learned"
    # learned: escalate when P(insufficient) exceeds this; None takes the artifact's threshold,
    # tuned on val by scripts/train_sufficiency.py.
    max_insufficiency: float | None = Field(default=None, ge=0, le=1)
    # signals: the grid point that, on val, escalates the most multihop questions while
    # escalating at most 10% of answerable lookups. Agreement 0.95 asks that the best passage
    # sit near the top of BOTH arms.
    min_coverage: float = Field(default=0.4, ge=0, le=1)
    min_agreement: float = Field(default=0.95, ge=0, le=2)


class FullContextConfig(BaseModel):
    """A tenant whose whole corpus fits the budget is answered from all of it, no retrieval."""

    model_config = SECTION

    enabled: bool = False
    max_tokens: int = Field(default=3000, ge=1, le=200_000)
    max_chunks: int = Field(default=40, ge=1, le=1000)


class RouterConfig(BaseModel):
    model_config = SECTION

    classifier: Literal["learned", "heuristic"] = "learned"
    # Below its threshold, a classifier's direct or multihop verdict is answered by lookup.
    thresholds: dict[Route, float] = Field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    escalation: EscalationConfig = EscalationConfig()
    full_context: FullContextConfig = FullContextConfig()
    # Rewrite follow-ups into self-contained questions with the small model (when configured).
    rewrite_followups: bool = True

    @field_validator("thresholds")
    @classmethod
    def _in_unit_range(cls, value: dict[Route, float]) -> dict[Route, float]:
        for route, threshold in value.items():
            if not 0 <= threshold <= 1:
                raise ValueError(f"{route.value}: a confidence threshold is between 0 and 1")
        return value

    @field_validator("rules")
    @classmethod
    def _unique_names(cls, value: tuple[Rule, ...]) -> tuple[Rule, ...]:
        names = [rule.name for rule in value]
        if len(names) != len(set(names)):
            raise ValueError("rule names must be unique (they label metrics)")
        return value
