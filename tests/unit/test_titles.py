"""Whether a query names a document by its title (`routers.titles`)."""

from __future__ import annotations

import pytest

from routers.titles import base_name, names_title


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
