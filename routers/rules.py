"""The routing section of the configuration: classifier, thresholds, ordered rules, escalation.

Validated whole at load: an unknown route, a regex that does not compile or a threshold out
of range is refused with the rule's path (e.g. `router.rules.2.when.query_regex`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from routers.types import Route

_FROZEN = ConfigDict(extra="forbid", frozen=True)


class RuleMatch(BaseModel):
    """Every condition given must hold; an empty match matches everything."""

    model_config = _FROZEN

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
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


class RuleAction(BaseModel):
    model_config = _FROZEN

    route: Route | None = None
    lexical_weight: float | None = Field(default=None, ge=0)
    dense_weight: float | None = Field(default=None, ge=0)


class Rule(BaseModel):
    model_config = _FROZEN

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    when: RuleMatch = RuleMatch()
    then: RuleAction


class EscalationConfig(BaseModel):
    model_config = _FROZEN

    # Off by default because it measured worse: on held-out FanOutQA dev, learned classifier +
    # escalation routes 65.5% correctly against 94.9% for the classifier alone, at 3x the cost
    # (bench/escalation_eval.py). A lookup with no hits at all still says so, grading or not.
    enabled: bool = False
    # From bench/escalation_eval.py (2026-11-30): on the val part of the FanOutQA dev split, over
    # the 10,033-page Wikipedia sample in the embedded index, the grid point that escalates the
    # most multihop questions (34%) while escalating at most 10% of answerable lookups (7.7%);
    # the old 0.5/0.5 escalated 11.5% of them. Held-out test: 9.5% of lookups, 42% of multihop.
    # Agreement 0.95 asks that the best passage sit near the top of BOTH arms. Both signals are
    # weak (AUC 0.76 / 0.79): see the benchmark before relying on escalation for recall.
    min_coverage: float = Field(default=0.4, ge=0, le=1)
    min_agreement: float = Field(default=0.95, ge=0, le=2)


class FullContextConfig(BaseModel):
    """A tenant whose whole corpus fits the budget is answered from all of it, no retrieval."""

    model_config = _FROZEN

    enabled: bool = False
    max_tokens: int = Field(default=3000, ge=1, le=200_000)
    max_chunks: int = Field(default=40, ge=1, le=1000)


class RouterConfig(BaseModel):
    model_config = _FROZEN

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
