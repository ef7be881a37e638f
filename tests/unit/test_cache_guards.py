"""Each guard refuses what it is for and lets a paraphrase through."""

import pytest

from gateway.cache.guards import MAX_SEMANTIC_CHARS, facts, refusal


def refused(a: str, b: str) -> str | None:
    return refusal(facts(a), facts(b))


@pytest.mark.parametrize(
    ("a", "b", "guard"),
    [
        ("What was the revenue in 2019?", "What was the revenue in 2020?", "numbers"),
        ("Who won the 3rd race?", "Who won the 4th race?", "numbers"),
        ("Planets with two rings?", "Planets with three rings?", "numbers"),
        ("What is 1,000 plus 5?", "What is 1000 plus 6?", "numbers"),
        ("Sales in March?", "Sales in April?", "dates"),
        ("Who was president before Lincoln?", "Who was president after Lincoln?", "dates"),
        ("What happened yesterday at the plant?", "What happened today at the plant?", "dates"),
        ("Which countries use the euro?", "Which countries do not use the euro?", "negation"),
        ("Which countries use the euro?", "Which countries don't use the euro?", "negation"),
        ("Which planets have rings?", "Which planets have no rings?", "negation"),
        ("Meals with meat", "Meals without meat", "negation"),
        ("What is the largest city in Peru?", "What is the smallest city in Peru?", "comparison"),
        ("What is the population of France?", "What is the population of Spain?", "entities"),
        ("Who founded Acme Corp?", "Who founded Globex Corp?", "entities"),
        ('What does "fail open" mean?', 'What does "fail closed" mean?', "entities"),
        ("How do I fix ERR-4471?", "How do I fix ERR-4472?", "numbers"),
        ("How do I fix ERR-AB1?", "How do I fix ERR-CD1?", "identifiers"),
        ("Is SKU_RED_XL in stock?", "Is SKU_BLUE_XL in stock?", "identifiers"),
        ("The 5 tallest peaks and their heights?", "The 5 tallest peaks?", "scope"),
        ("Who founded each Ivy League school?", "Who founded the Ivy League schools?", "scope"),
        # The review's pairs: the same words in another order.
        ("Did Germany invade France in 1940?", "Did France invade Germany in 1940?", "order"),
        ("Convert USD to EUR", "Convert EUR to USD", "order"),
        ("How do I migrate MySQL to Postgres?", "How do I migrate Postgres to MySQL?", "order"),
        ("Is Paris north of London?", "Is London north of Paris?", "order"),
        ("Do dogs chase cats?", "Do cats chase dogs?", "order"),
        ("Is ERR-17 before ERR-18?", "Is ERR-18 before ERR-17?", "order"),
        # Negation by prefix, and contractions without their apostrophe.
        ("Is it legal to park here?", "Is it illegal to park here?", "negation"),
        ("Is the drug safe?", "Is the drug unsafe?", "negation"),
        ("Is the process reversible?", "Is the process irreversible?", "negation"),
        ("Is the claim possible?", "Is the claim impossible?", "negation"),
        ("Is the offer valid?", "Is the offer invalid?", "negation"),
        ("Does Acme agree?", "Does Acme disagree?", "negation"),
        ("Why does it work?", "Why doesnt it work?", "negation"),
        ("Which countries use the euro?", "Which countries dont use the euro?", "negation"),
        ("Is the port open?", "Isnt the port open?", "negation"),
        # Hyphenated number words, ordinals past twelfth, a decimal comma.
        ("Events of the twenty-first century?", "Events of the twenty-second century?", "numbers"),
        ("Who won the nineteenth race?", "Who won the eighteenth race?", "numbers"),
        ("Who was the thirtieth president?", "Who was the fortieth president?", "numbers"),
        ("Is the dose 1,5 mg?", "Is the dose 15 mg?", "numbers"),
    ],
)
def test_a_guard_refuses_questions_that_differ_in_what_it_reads(a: str, b: str, guard: str) -> None:
    assert refused(a, b) == guard
    assert refused(b, a) == guard  # symmetric


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Who designed the Eiffel Tower?", "who designed the eiffel tower"),
        ("Who designed the Eiffel Tower?", "Who was the designer of the Eiffel Tower?"),
        ("Which countries don't use the euro?", "Which countries do not use the euro?"),
        ("What was the revenue in 2019?", "In 2019, what was the revenue?"),
        ("How do I fix ERR-4471?", "how can I fix err-4471"),
        ("What is the capital of France?", "Tell me the capital of France."),
        ("What does the 1st clause say?", "What does the first clause say?"),
        ("What is the population of Macau?", "What's the population of Macau?"),
        ("What is Macau's population?", "what is macau's population"),
        ("Which countries don't use the euro?", "Which countries dont use the euro?"),
        ("Events of the twenty-first century?", "Events of the 21st century?"),
        ("Is the dose 1,500 mg?", "Is the dose 1500 mg?"),
        ("How do I reset the router?", "How can I reset the router?"),
    ],
)
def test_a_paraphrase_passes_every_guard(a: str, b: str) -> None:
    assert refused(a, b) is None


def test_a_capitalised_common_word_is_not_an_entity() -> None:
    assert facts("What is the capital of France?").entities == {"france"}
    assert facts("Please list the planets.").entities == frozenset()


def test_may_is_a_month_only_when_it_is_one() -> None:
    assert refused("Sales in May?", "Sales in June?") == "dates"
    assert facts("May I ask about the tower?").dates == frozenset()


@pytest.mark.parametrize(
    "text",
    ["a-" * 4000, "1," * 4000, '"' * 8000, "“" * 8000, "«" * 8000, "A" * 8000, "a'" * 4000],
)
def test_guards_are_fast_on_adversarial_input(text: str) -> None:
    """Their work is bounded by the prefix they read, whatever the input's length; that their
    patterns are linear on adversarial text is tests/unit/test_regex_bounds.py's check."""
    assert len(text) > MAX_SEMANTIC_CHARS
    assert facts(text) == facts(text[:MAX_SEMANTIC_CHARS])  # the guards read a bounded prefix
    reversed_prefix = text[::-1][:MAX_SEMANTIC_CHARS]
    assert refusal(facts(text), facts(text[::-1])) == refusal(
        facts(text[:MAX_SEMANTIC_CHARS]), facts(reversed_prefix)
    )
