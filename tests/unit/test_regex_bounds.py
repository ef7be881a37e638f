"""No regex that reads client text backtracks super-linearly: every pattern against adversarial
8,000-character inputs (the default query limit) stays under a generous bound of the test
thread's CPU time, which other processes on a busy machine do not inflate as they do wall time.

A correctness guard against catastrophic backtracking, not a benchmark: a linear pattern takes
about a millisecond on these inputs; a backtracking one takes from about a second (a nested
quantifier on "a-" * 4000) to minutes (a heading pattern on a line of 8,000 spaces).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from types import ModuleType

import pytest

import backends.retrieval.embedded.search
import backends.retrieval.opensearch.config
import backends.retrieval.opensearch.queries
import gateway.cache.guards
import gateway.http.handlers.documents
import gateway.http.middleware.request_id
import gateway.ingest.chunker
import gateway.text
import routers.agent_tools
import routers.features
import routers.grading
import routers.prompts
import routers.rewrite
import routers.sentences
import routers.small_talk
from gateway.ingest.chunker import heading
from routers.features import _chain_count, identifiers_in, lexical_features
from routers.rules import RuleMatch
from routers.sentences import split_sentences
from routers.small_talk import small_talk

SIZE = 8000
BOUND_S = 0.05

# Every module whose patterns see a query, a conversation or a document. routers.generation
# reads the model's answer (a few thousand characters at most) with windows of at most 200
# characters: linear, but 200 steps a character on "#" * 8000 (~60 ms), so not listed here.
MODULES: tuple[ModuleType, ...] = (
    routers.features,
    routers.rewrite,
    routers.small_talk,
    routers.sentences,
    routers.grading,
    routers.prompts,
    routers.agent_tools,
    backends.retrieval.embedded.search,
    backends.retrieval.opensearch.config,
    backends.retrieval.opensearch.queries,
    gateway.cache.guards,
    gateway.ingest.chunker,
    gateway.http.handlers.documents,
    gateway.http.middleware.request_id,
    gateway.text,
)
# Quadratic on their own; only ever run through the bounded functions tested below.
BOUNDED_BY_CALLER = {"_CODE": "identifiers_in", "_CHAIN": "_chain_count"}

UNITS = [
    "a-", "A-", "A1-", "a_", "1-a", "-", "_", "a", "A", " ", "\t", "\n", "\n \n", "#", "# ",
    " #", "0x", "AB1", "a'", "'", '"', "é", "aé-", ". A", "!", "[", "[1", "x#1", "<", "< ",
    "%", "%4", "where ", "where x ", " was born", "the same ", "est ", "and ", "ERR-",
    "a1b2-", "\x00", "\x85",
]  # fmt: skip
PREFIXES = ["", "# a", "where ", "<source "]


def adversarial() -> list[str]:
    out = []
    for unit in UNITS:
        body = (unit * (SIZE // len(unit) + 1))[:SIZE]
        for prefix in PREFIXES:
            text = prefix + body
            out += [text[:SIZE], text[: SIZE - 1] + "é"]
    return out


INPUTS = adversarial()


def patterns() -> list[tuple[str, re.Pattern[str]]]:
    found = {}
    for module in MODULES:
        for name, value in vars(module).items():
            is_text_pattern = isinstance(value, re.Pattern) and isinstance(value.pattern, str)
            if is_text_pattern and name not in BOUNDED_BY_CALLER:
                found[f"{module.__name__}.{name}"] = value
    return sorted(found.items())


def slowest(fn: Callable[[str], object]) -> tuple[float, str]:
    worst = (0.0, "")
    for text in INPUTS:
        elapsed = _timed(fn, text)
        if elapsed >= BOUND_S:  # a scheduler hiccup passes on a retry; backtracking does not
            elapsed = min(_timed(fn, text) for _ in range(2))
        worst = max(worst, (elapsed, text[:20]))
    return worst


def _timed(fn: Callable[[str], object], text: str) -> float:
    start = time.thread_time()
    fn(text)
    return time.thread_time() - start


@pytest.mark.parametrize(("name", "pattern"), patterns(), ids=lambda v: str(v))
def test_each_pattern_is_fast_on_adversarial_input(name: str, pattern: re.Pattern[str]) -> None:
    def every_use(text: str) -> None:
        pattern.findall(text)
        pattern.search(text)
        pattern.match(text)
        pattern.split(text)

    elapsed, text = slowest(every_use)
    assert elapsed < BOUND_S, f"{name} took {elapsed * 1000:.0f} ms on {text!r}..."


@pytest.mark.parametrize(
    "fn",
    [
        identifiers_in,
        _chain_count,
        lexical_features,
        small_talk,
        split_sentences,
        heading,
        gateway.text.clean_text,
    ],
    ids=lambda f: f.__name__,
)
def test_each_bounded_function_is_fast_on_adversarial_input(fn: Callable[[str], object]) -> None:
    elapsed, text = slowest(fn)
    assert elapsed < BOUND_S, f"{fn.__name__} took {elapsed * 1000:.0f} ms on {text!r}..."


def test_the_patterns_bounded_by_their_callers_are_still_defined() -> None:
    for name in BOUNDED_BY_CALLER:
        assert isinstance(getattr(routers.features, name), re.Pattern)


@pytest.mark.parametrize("regex", ["(a+)+$", "(a|aa)+$", "(.*a){12}", "(?i)(x+x+)+y"])
def test_a_configured_rule_regex_runs_in_linear_time(regex: str) -> None:
    match = RuleMatch(query_regex=regex)
    elapsed, text = slowest(match.query_matches)
    assert elapsed < BOUND_S, f"{regex} took {elapsed * 1000:.0f} ms on {text!r}..."


@pytest.mark.parametrize("regex", [r"(a)\1", r"(?<=x)y", r"(?=a)b", "["])
def test_a_rule_regex_re2_cannot_run_is_refused_at_load(regex: str) -> None:
    with pytest.raises(ValueError, match="RE2"):
        RuleMatch(query_regex=regex)


def test_rule_regexes_keep_their_meaning() -> None:
    match = RuleMatch(query_regex="(?i)invoice|refund")
    assert match.query_matches("Where is my INVOICE?")
    assert not match.query_matches("Where is my order?")
    assert RuleMatch().query_matches("anything")
