"""Whether a query names a document by its title (`routers.titles`)."""

from __future__ import annotations

import pytest

from routers.rerank import title_matches
from routers.titles import asks_which, base_name, names_title


@pytest.mark.parametrize(
    ("title", "base"),
    [
        ("Mercury (planet)", "Mercury"),
        ("Salvador, Bahia", "Salvador"),
        ("Francis II, Holy Roman Emperor", "Francis II"),
        ("Eastern Front (World War II)", "Eastern Front"),
        ("(What) a title", "(What) a title"),  # a parenthesis that does not end it stays
        ("Texas", "Texas"),
    ],
)
def test_the_base_name_drops_a_trailing_qualifier_and_what_follows_a_comma(
    title: str, base: str
) -> None:
    assert base_name(title) == base


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("What is the population of Texas?", "Texas"),
        ("Was Mercury discovered after 1700?", "Mercury (planet)"),
        ("What was the population of Salvador in 2010?", "Salvador, Bahia"),
        ("What is India's national anthem called?", "India"),
        ("What happened in 1984?", "1984"),  # a number names a page as a capital does
        ("Who designed the Eiffel Tower?", "Eiffel Tower"),
        ("who designed the Eiffel tower?", "Eiffel Tower"),  # case-insensitive past the first
    ],
)
def test_a_proper_name_in_the_query_names_the_page(query: str, title: str) -> None:
    assert names_title(query, title)


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("What is India's national anthem called?", "National anthem"),  # a common noun
        ("What is the capital of Mongolia?", "Inner Mongolia"),  # a longer name
        ("What is the Iranian calendar?", "Iran"),  # inside a word
        ("Where is Texarkana?", "Texas"),
        ("what is the population of texas?", "Texas"),  # written in lower case: no name
        ("Who was Ernest Hemingway?", ""),  # an empty title names nothing
        ("Where is İzmir?", "Izmir"),  # lower() moves offsets: no claim is made
    ],
)
def test_anything_else_does_not(query: str, title: str) -> None:
    assert not names_title(query, title)


def test_a_later_occurrence_counts_when_the_first_is_not_a_name() -> None:
    assert names_title("the china cup, and China?", "China")


@pytest.mark.parametrize(
    "query",
    [
        "Which Italian astronomer championed heliocentrism?",
        "In which city is the Louvre?",
        "Whose capital is Nairobi?",
        "What is located on the east bank of the Irrawaddy River, north of Yangon?",
        "Who was a Roman emperor of the Nerva-Antonine dynasty?",
        "What is the largest city in Pakistan?",
        "What is the second most populous city in the country?",
        "What is 432 km west-southwest from Algiers?",
    ],
)
def test_a_question_describing_the_page_it_wants_names_none(query: str) -> None:
    assert asks_which(query)
    assert title_matches(query, ["Irrawaddy River", "Pakistan", "Algiers", "Louvre"]) == [False] * 4


@pytest.mark.parametrize(
    "query",
    [
        "What is the population of Pakistan?",
        "What is the GDP of Iran?",
        "What is Google's online video platform?",
        "Who is Michael Jordan?",
        "How old is Taylor Swift?",
        "Who discovered Neptune?",
    ],
)
def test_a_question_about_a_named_thing_keeps_the_signal(query: str) -> None:
    assert not asks_which(query)


def test_the_gate_turns_off_a_title_the_query_does_name() -> None:
    assert title_matches("What is the population of Pakistan?", ["Pakistan"]) == [True]
    assert title_matches("What is the largest city in Pakistan?", ["Pakistan"]) == [False]
