"""The sentence splitter of extractive answers, on the Wikipedia sample's own text and on the
cases that break a naive split (abbreviations, decimals, initials, quotes, wrapped lines)."""

from __future__ import annotations

import pytest

from gateway.ingest.wiki_sample import load_wiki_sample
from routers.sentences import split_sentences


@pytest.fixture(scope="module")
def wiki() -> dict[str, str]:
    return {d.doc_id: d.text for d in load_wiki_sample()}


def test_a_sample_lead_splits_at_its_sentences_and_nowhere_else(wiki: dict[str, str]) -> None:
    assert split_sentences(wiki["Alfred Nobel"]) == [
        "Alfred Bernhard Nobel was a Swedish chemist, inventor, engineer, and businessman.",
        "Nobel is known for inventing dynamite, as well as having bequeathed his fortune to "
        "establish the Nobel Prizes.",
        "He worked on various important contributions and inventions to science, holding 355 "
        "patents during his life.",
    ]


def test_initials_acronyms_and_numbers_in_sample_text_do_not_end_a_sentence(
    wiki: dict[str, str],
) -> None:
    king = split_sentences(wiki["B. B. King"])[0]
    assert king.startswith("Riley B. King, known professionally as B.\xa0B. King, was")
    assert king.endswith("record producer.")
    jackson = split_sentences(wiki["Andrew Jackson"])[1]
    assert jackson == (
        "He rose to fame as a U.S. Army general and served in both houses of the U.S. Congress."
    )
    area = split_sentences(wiki["Australia"])[1]
    assert area.startswith("It has a land area of 7,688,287\xa0km2 (2,968,464\xa0sq\xa0mi)")
    assert area.endswith("inhabited continent.")


def test_every_sample_sentence_is_verbatim_text_of_its_lead(wiki: dict[str, str]) -> None:
    for doc_id in ("Galileo Galilei", "Photosynthesis", "Eiffel Tower", "Yuri Gagarin"):
        sentences = split_sentences(wiki[doc_id])
        assert len(sentences) > 1
        # Nothing lost, nothing added, in order (white space aside).
        assert " ".join(sentences).split() == wiki[doc_id].split()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "J. R. R. Tolkien wrote it. George W. Bush read it.",
            ["J. R. R. Tolkien wrote it.", "George W. Bush read it."],
        ),
        (
            "It cost $1.5 million, approx. three times more. Pi is 3.14 or so.",
            ["It cost $1.5 million, approx. three times more.", "Pi is 3.14 or so."],
        ),
        (
            "Dr. Smith met St. John at No. 5 Main St. The talk ended.",
            ["Dr. Smith met St. John at No. 5 Main St.", "The talk ended."],
        ),
        (
            "The U.S. Congress met. Then it moved to the U.S. It was 1950.",
            ["The U.S. Congress met.", "Then it moved to the U.S.", "It was 1950."],
        ),
        (
            'Galileo (b. 1564, d. 1642) was an astronomer. He said "Eppur si muove." It moved.',
            [
                "Galileo (b. 1564, d. 1642) was an astronomer.",
                'He said "Eppur si muove."',
                "It moved.",
            ],
        ),
        (
            "They ruled c. 1500 BC, e.g. in Egypt. Justinian I. It was. Warner Bros. Pictures.",
            [
                "They ruled c. 1500 BC, e.g. in Egypt.",
                "Justinian I.",
                "It was.",
                "Warner Bros. Pictures.",
            ],
        ),
        ("It is 1.5 m. Adults weigh more.", ["It is 1.5 m.", "Adults weigh more."]),
        ("What? Yes! Well… Next one.", ["What?", "Yes!", "Well…", "Next one."]),
        ("He waited... and then left.", ["He waited... and then left."]),
    ],
    ids=[
        "initials",
        "decimals-approx",
        "titles-street",
        "acronym-ambiguous",
        "labels-quotes",
        "circa-eg-roman-bros",
        "unit-after-number",
        "other-marks",
        "ellipsis-lowercase",
    ],
)
def test_abbreviations_and_numbers_are_read_in_context(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_wrapped_lines_join_and_paragraphs_and_list_items_break() -> None:
    text = (
        "The router refuses the upstream connection because its TLS\n"
        "certificate expired. Renew it.\n\nNext paragraph without a stop\n- first item\n"
        "- second item"
    )
    assert split_sentences(text) == [
        "The router refuses the upstream connection because its TLS certificate expired.",
        "Renew it.",
        "Next paragraph without a stop",
        "- first item",
        "- second item",
    ]


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "."])
def test_blank_text_has_no_empty_sentence(text: str) -> None:
    assert all(s for s in split_sentences(text))
