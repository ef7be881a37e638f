"""The style benchmark's rules (scripts/make_style_benchmark.py) on hand-made lead sections."""

import json
from pathlib import Path

import pytest

import scripts.make_style_benchmark as style
from gateway.ingest.readers import RawDocument
from scripts.make_lexical_benchmark import Index
from scripts.make_style_benchmark import generate, make_query


def doc(title: str, text: str) -> RawDocument:
    return RawDocument(doc_id=title, title=title, text=text)


GRAIL = doc(
    "Holy Grail",
    "The Holy Grail is a treasure that serves as an important motif in Arthurian literature. "
    "It is often guarded in the custody of the Fisher King. "
    "Various traditions describe the Holy Grail as a cup.",
)
TSINGHUA = doc(
    "Tsinghua University",
    "Tsinghua University is a public research university in Haidian, Beijing. "
    "It is affiliated with and funded by the Ministry of Education of China. "
    "It is also a member of the C9 League.",
)
KEATS = doc(
    "John Keats",
    "John Keats was an English poet of the second generation of Romantic poets. "
    "His poems had been in publication for less than four years when he died.",
)
POET = doc("Percy Shelley", "Percy Shelley was an English poet of the Romantic generation.")
DOCS = [GRAIL, TSINGHUA, KEATS, POET]
INDEX = Index(DOCS)


def test_which_asks_for_the_first_sentences_description_its_relative_pronoun_dropped() -> None:
    assert make_query("which", GRAIL, INDEX) == (
        "Which treasure serves as an important motif in Arthurian literature?"
    )


def test_which_skips_a_description_holding_a_title_word() -> None:
    # "public research university in Haidian": "university" is the title's.
    assert make_query("which", TSINGHUA, INDEX) is None


def test_which_skips_a_description_another_page_holds_every_content_word_of() -> None:
    # Shelley's lead holds english, poet, generation and romantic too, but not "second".
    assert make_query("which", KEATS, INDEX) == (
        "Which English poet of the second generation of Romantic poets?"
    )
    assert make_query("which", POET, INDEX) is None  # Keats's lead holds all of its words


def test_clue_turns_a_later_sentences_pronoun_into_a_question_word() -> None:
    assert make_query("clue", TSINGHUA, INDEX) == (
        "What is affiliated with and funded by the Ministry of Education of China?"
    )
    assert make_query("clue", KEATS, INDEX) == (
        "Whose poems had been in publication for less than four years when he died?"
    )


def test_clue_skips_sentences_naming_the_page_and_the_first_sentence() -> None:
    grail = doc(
        "Holy Grail", "It is a treasure in legends. Various traditions describe the Holy Grail."
    )
    assert make_query("clue", grail, Index([grail])) is None


def test_clue_drops_an_also_after_the_verb() -> None:
    member = doc("Tsinghua", "Tsinghua is old. It is also a member of the C9 League of China.")
    assert make_query("clue", member, Index([member])) == (
        "What is a member of the C9 League of China?"
    )


def test_generate_numbers_each_kind_in_page_order_at_most_once_per_page() -> None:
    rows = list(generate(DOCS, per_kind=10))
    assert [r["id"] for r in rows] == ["which-001", "which-002", "clue-001", "clue-002", "clue-003"]
    pages = ["Holy Grail", "John Keats", "Holy Grail", "John Keats", "Tsinghua University"]
    assert [r["page"] for r in rows] == pages
    assert rows == list(generate(list(reversed(DOCS)), per_kind=10))


def test_the_held_out_part_uses_no_taken_page_and_keeps_the_others_rows() -> None:
    rows = list(generate(DOCS, per_kind=10, taken=frozenset({"Holy Grail"})))
    assert {r["page"] for r in rows} == {"John Keats", "Tsinghua University"}
    untaken = [r for r in generate(DOCS, per_kind=10) if r["page"] != "Holy Grail"]
    assert [(r["kind"], r["query"]) for r in rows] == [(r["kind"], r["query"]) for r in untaken]


def test_a_part_is_not_made_without_the_parts_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(style, "PARTS", (tmp_path / "missing.jsonl", tmp_path / "second.jsonl"))
    with pytest.raises(SystemExit, match=r"missing\.jsonl is missing: make the parts before"):
        list(style.generate_part(2, DOCS, per_kind=10))


def test_each_part_leaves_out_every_earlier_parts_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    galileo = doc(
        "Galileo Galilei", "Galileo Galilei was an Italian astronomer who championed heliocentrism."
    )
    docs = [*DOCS, galileo]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(json.dumps({"query": "Which treasure?", "page": "Holy Grail"}) + "\n")
    second.write_text(json.dumps({"query": "Which poet?", "page": "John Keats"}) + "\n")
    monkeypatch.setattr(style, "PARTS", (first, second, tmp_path / "third.jsonl"))
    assert "Holy Grail" in {r["page"] for r in style.generate_part(1, docs, per_kind=10)}
    assert "Holy Grail" in style.benchmark_pages(docs, [first])
    second_pages = {r["page"] for r in style.generate_part(2, docs, per_kind=10)}
    assert "John Keats" in second_pages and "Holy Grail" not in second_pages
    third_pages = {r["page"] for r in style.generate_part(3, docs, per_kind=10)}
    assert "Galileo Galilei" in third_pages
    assert not third_pages & {"Holy Grail", "John Keats"}


def test_the_shipped_parts_after_the_first_share_no_page_with_anything_before() -> None:
    """docs/reranking.md: parts 2-4 are on pages of no earlier part and no other benchmark;
    part 1, made first, shares 17 pages with FanOutQA's and 23 with the lexical benchmark's."""
    from bench.retrieval_eval import load_lexical, load_queries
    from gateway.ingest.wiki_sample import load_wiki_sample

    ids = {d.doc_id for d in load_wiki_sample()}
    fanoutqa = {q.page for q in load_queries(ids)}
    lexical = {q.page for q in load_lexical(ids)}
    parts = [{json.loads(line)["page"] for line in p.open(encoding="utf-8")} for p in style.PARTS]
    assert (len(parts[0] & fanoutqa), len(parts[0] & lexical)) == (17, 23)
    for n, pages in enumerate(parts[1:], start=1):
        earlier = set().union(*parts[:n], fanoutqa, lexical)
        assert pages and not pages & earlier, n
