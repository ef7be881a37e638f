"""Cheap lexical features of a question: the signals both classifiers read.

Every feature is a float in [0, 1] (counts are squashed) so the learned model can take them as
they are and the heuristic can compare them with simple thresholds. Names are stable: they show
up in `route_reason` and in the trained model's artifact.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_WORD = re.compile(r"[\w'-]+")
_CAPITALISED = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-zA-Z0-9'-]+")
_IDENTIFIER = re.compile(
    r"\b(?:[A-Z]{2,}[-_]?\d+[\w-]*|\d+[-_][A-Z0-9]+[\w-]*|[A-Za-z]+_[A-Za-z0-9_]+|0x[0-9a-f]+)\b"
)
# Wider than _IDENTIFIER, which is frozen with the trained router's artifact (changing a feature
# means retraining): any hyphen- or underscore-joined token with a digit in it (ZX-F92A8D, A1_B2).
_CODE = re.compile(r"\b(?=[\w-]*\d)[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)+\b")
# _CODE's lookahead rescans the rest of a hyphenated run from every word in it: quadratic in the
# run's length, on the event loop. So it only sees runs of word characters and hyphens (the most
# it can reach) of at most 64 characters: the same matches as on the whole text for those, linear
# overall; a longer run is not an identifier.
_RUN = re.compile(r"[\w-]+")
_MAX_CODE_RUN = 64
_QUOTED = re.compile(r"\"[^\"]{2,}\"|'[^']{3,}'")
_GREETING = re.compile(
    r"^\s*(hi|hello|hey|yo|good (morning|afternoon|evening)|thanks|thank you|thx|cheers|bye|"
    r"goodbye|ok(ay)?|great|cool|nice|who are you|what can you do|how are you)\b[\s!.?,]*",
    re.IGNORECASE,
)
_META = re.compile(
    r"\b(you (just )?said|your (last|previous) (answer|message)|rephrase|summari[sz]e (that|this|"
    r"it)|say (that|it) again|in (simpler|plain) (words|terms)|translate (that|this|it))\b",
    re.IGNORECASE,
)
_QUANTIFIER = re.compile(r"\b(each|every|all|both|any of|all of|respectively|per)\b", re.I)
_COMPARE = re.compile(
    r"\b(compare|comparison|versus|vs\.?|difference between|differ|more than|less than|"
    r"older|younger|larger|smaller|bigger|higher|lower|earlier|later|longer|shorter|"
    r"which (one|of)|same as)\b",
    re.IGNORECASE,
)
_SUPERLATIVE = re.compile(
    r"\b(most|least|best|worst|largest|smallest|highest|lowest|oldest|youngest|first|last|"
    r"earliest|latest|biggest|longest|shortest|\w+est)\b",
    re.IGNORECASE,
)
_CHAIN_BEFORE = (
    r"and then|after that|whose|of the (person|city|country|company|team|one) (that|who|which)"
)
_CHAIN_AFTER = r"the same|in total|combined|sum of|average of|how many of"
_CHAIN = re.compile(
    rf"\b({_CHAIN_BEFORE}|where .* was born|{_CHAIN_AFTER})\b",
    re.IGNORECASE,
)
# `where .* was born` rescans to the end of the line from every "where": quadratic. _chain_count
# gives _CHAIN's count in linear time: it matches at most once a line, from the first "where" to
# the last " was born", so only that stretch of the line is searched with it.
_CHAIN_BUT_BORN = re.compile(rf"\b({_CHAIN_BEFORE}|{_CHAIN_AFTER})\b", re.IGNORECASE)
_WHERE = re.compile(r"\bwhere ", re.IGNORECASE)
_WAS_BORN = re.compile(r" was born\b", re.IGNORECASE)
_AGGREGATE = re.compile(r"\b(how many|total|sum|average|mean|median|count|list)\b", re.I)
_WH = re.compile(r"\b(who|what|when|where|which|why|how)\b", re.IGNORECASE)


def _squash(count: int, scale: float) -> float:
    """Map a count to [0, 1): 0 -> 0, `scale` -> 0.5."""
    return count / (count + scale)


def _count(pattern: re.Pattern[str]) -> Callable[[str], int]:
    return lambda text: len(pattern.findall(text))


_COUNTERS: dict[str, tuple[Callable[[str], int], float]] = {
    "entities": (_count(_CAPITALISED), 2.0),
    "identifiers": (_count(_IDENTIFIER), 0.5),
    "quoted": (_count(_QUOTED), 0.5),
    "quantifiers": (_count(_QUANTIFIER), 0.5),
    "compare": (_count(_COMPARE), 0.5),
    "superlative": (_count(_SUPERLATIVE), 1.0),
    "chain": (lambda text: _chain_count(text), 0.5),
    "aggregate": (_count(_AGGREGATE), 0.5),
    "wh_words": (_count(_WH), 1.0),
    "questions": (lambda text: text.count("?"), 1.0),
    "commas_and": (lambda text: text.count(",") + len(re.findall(r"\band\b", text)), 2.0),
}

FEATURE_NAMES: tuple[str, ...] = (*_COUNTERS, "length", "greeting", "meta")


def _chain_count(text: str) -> int:
    """len(_CHAIN.findall(text)), linear in the text's length (`.` stops at a newline)."""
    count = 0
    for line in text.split("\n"):
        where = _WHERE.search(line)
        borns = list(_WAS_BORN.finditer(line))
        born = borns[-1] if borns else None
        if where is None or born is None or born.start() < where.end():
            count += len(_CHAIN_BUT_BORN.findall(line))
            continue
        # The first "where" matches through the last " was born"; none can match after it.
        count += len(_CHAIN.findall(line[: born.end()]))
        count += len(_CHAIN_BUT_BORN.findall(line[born.end() :]))
    return count


def lexical_features(text: str) -> dict[str, float]:
    """All features of `text`, keyed by FEATURE_NAMES, in that order."""
    features = {name: _squash(fn(text), scale) for name, (fn, scale) in _COUNTERS.items()}
    features["length"] = _squash(len(_WORD.findall(text)), 15.0)
    # A greeting that carries a real question ("hi, what is X?") is not small talk.
    short = len(_WORD.findall(text)) <= 6
    features["greeting"] = 1.0 if _GREETING.match(text) and short else 0.0
    features["meta"] = 1.0 if _META.search(text) else 0.0
    return features


def identifiers_in(text: str) -> list[str]:
    """Identifier-like tokens (error codes, SKUs, snake_case names): lexical search wins here."""
    codes = [
        code
        for run in _RUN.findall(text)
        if len(run) <= _MAX_CODE_RUN
        for code in _CODE.findall(run)
    ]
    found = _IDENTIFIER.findall(text) + codes
    return list(dict.fromkeys(found))
