"""Extractive answers (no model): which sentences of real sample passages are quoted, how they
are cited and bounded, and in which order after a rerank stage, with the embedder the gateway
serves with.

The passages are Wikipedia lead sections of the offline sample (tests/data/wiki, CC BY-SA).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.embeddings.base import Embedder, token_window
from backends.retrieval.base import Hit
from gateway.ingest.chunker import chunk_document
from routers.extractive import (
    MAX_CHARS,
    MAX_SENTENCES,
    NO_ANSWER_TEXT,
    RELEVANCE_FLOOR,
    Extractor,
)
from routers.sentences import split_sentences

DATA = Path(__file__).resolve().parents[1] / "data"
LEADS = (DATA / "wiki" / "leads.jsonl").read_text("utf-8")
WIKI = {row["id"]: row for row in map(json.loads, LEADS.splitlines())}
ERRORS = (DATA / "acme" / "errors.md").read_text("utf-8")


def hits(*doc_ids: str) -> list[Hit]:
    """The passages as a search returns them, best first (scores only order them here)."""
    return [
        Hit(d, f"{d}#0", WIKI[d]["title"], "", WIKI[d]["text"], 1.0 - i / 10)
        for i, d in enumerate(doc_ids)
    ]


async def ask(
    embedder: Embedder,
    query: str,
    found: list[Hit],
    *,
    search_order: bool = False,
    max_tokens: int | None = None,
) -> object:
    vector = (await embedder.embed([query]))[0]
    extractor = Extractor(embedder, search_order=search_order)
    return await extractor.answer(query, vector, found, max_tokens)


async def test_the_best_sentence_is_quoted_verbatim_and_cited(served_embedder: Embedder) -> None:
    found = hits("Photosynthesis", "Alfred Nobel", "Eiffel Tower")
    answer = await ask(served_embedder, "Who invented dynamite?", found)
    assert answer.extractive and answer.complete and answer.finish_reason == "stop"
    assert [c.doc_id for c in answer.citations] == ["Alfred Nobel"]  # ranked third, cited first
    assert "Nobel is known for inventing dynamite" in answer.text
    assert answer.text.endswith(" [1]") and answer.text.count("[") == 1
    # Whole sentences of the passage, verbatim, in its reading order; the snippet is the quote.
    quoted = answer.text.removesuffix(" [1]")
    sentences = split_sentences(WIKI["Alfred Nobel"]["text"])
    picked = [s for s in sentences if s in quoted]
    assert " ".join(picked) == quoted
    assert answer.citations[0].snippet == quoted[:300] + ("…" if len(quoted) > 300 else "")


async def test_an_off_topic_passage_below_the_floor_is_not_cited(
    served_embedder: Embedder,
) -> None:
    query = "Who designed the Eiffel Tower?"
    found = hits("Carrot", "Eiffel Tower", "Gustave Eiffel")
    vector = (await served_embedder.embed([query]))[0]
    extractor = Extractor(served_embedder)
    scored = await extractor.score(query, vector, found)
    carrot = max(c.similarity for c in scored.candidates if c.passage == 0)
    assert carrot < RELEVANCE_FLOOR  # the search ranked it first; the floor says it is off-topic
    answer = await extractor.answer(query, vector, found, None)
    cited = [c.doc_id for c in answer.citations]
    assert "Carrot" not in cited and cited[0] in ("Eiffel Tower", "Gustave Eiffel")
    assert "Gustave Eiffel" in answer.text


async def test_the_answer_stays_within_its_bounds_and_groups_by_passage(
    served_embedder: Embedder,
) -> None:
    found = hits("Photosynthesis", "Plant", "Chlorophyll", "Algae")
    answer = await ask(served_embedder, "Explain photosynthesis", found)
    quoted = [q for q in answer.text.split("]") if q.strip()]
    assert 1 <= len(answer.citations) == len(quoted) <= MAX_SENTENCES
    sentences = sum(len(split_sentences(c.snippet.removesuffix("…"))) for c in answer.citations)
    assert sentences <= MAX_SENTENCES
    assert len(answer.text) <= MAX_CHARS + 4 * len(answer.citations)  # " [i]" after each
    assert answer.citations[0].doc_id == "Photosynthesis"
    assert answer.text.startswith("Photosynthesis is a system of biological processes")


async def test_nothing_above_the_floor_says_the_documents_give_no_answer(
    served_embedder: Embedder,
) -> None:
    answer = await ask(served_embedder, "How do I reset the Zorblax 9000?", hits("Carrot", "Moon"))
    assert answer.text == NO_ANSWER_TEXT
    assert answer.citations == () and not answer.complete and answer.extractive
    assert "relevance floor" in answer.notes[-1]


@pytest.mark.parametrize("max_tokens", [12, 40])
async def test_max_tokens_cuts_the_answer_by_the_embedders_tokenizer(
    served_embedder: Embedder, max_tokens: int
) -> None:
    found = hits("Photosynthesis", "Plant", "Chlorophyll")
    whole = await ask(served_embedder, "Explain photosynthesis", found)
    window = token_window(served_embedder)
    assert window is not None and window.count(whole.text) > 40
    cut = await ask(served_embedder, "Explain photosynthesis", found, max_tokens=max_tokens)
    assert window.count(cut.text) <= max_tokens
    assert cut.finish_reason == "length" and not cut.complete
    assert cut.text.endswith("… [1]") and cut.citations[0].doc_id == "Photosynthesis"
    assert cut.text.removesuffix(" … [1]") in whole.text
    roomy = await ask(served_embedder, "Explain photosynthesis", found, max_tokens=10_000)
    assert roomy.text == whole.text and roomy.finish_reason == "stop"


async def test_a_cut_drops_the_lowest_ranked_sentences_first(served_embedder: Embedder) -> None:
    query, found = "Who invented dynamite?", hits("Dynamite", "Alfred Nobel")
    vector = (await served_embedder.embed([query]))[0]
    extractor = Extractor(served_embedder)
    best = (await extractor.score(query, vector, found)).candidates[0].text
    whole = await extractor.answer(query, vector, found, None)
    assert whole.text.count("[") == 2 and best in whole.text
    room = extractor.count(f"{best} [1]")
    cut = await extractor.answer(query, vector, found, room)
    assert cut.text == f"{best} [1]" and len(cut.citations) == 1
    assert cut.finish_reason == "length"


async def test_after_a_rerank_stage_the_searchs_first_passage_leads(
    served_embedder: Embedder,
) -> None:
    # The search (reranked) ranks Alfred Nobel first; by cosine the Dynamite sentence leads.
    found = hits("Alfred Nobel", "Dynamite")
    plain = await ask(served_embedder, "Who invented dynamite?", found)
    answer = await ask(served_embedder, "Who invented dynamite?", found, search_order=True)
    assert [c.doc_id for c in plain.citations] == ["Dynamite", "Alfred Nobel"]
    assert [c.doc_id for c in answer.citations] == ["Alfred Nobel", "Dynamite"]
    # The passages follow the search's order: the answer opens with Alfred Nobel's sentences.
    opening = answer.text.split(" [1]")[0]
    assert opening and all(s in WIKI["Alfred Nobel"]["text"] for s in split_sentences(opening)), (
        answer.text
    )
    assert not any(s in opening for s in split_sentences(WIKI["Dynamite"]["text"]))


async def test_the_first_passage_leads_only_with_a_sentence_over_the_floor(
    served_embedder: Embedder,
) -> None:
    # Carrot says nothing of dynamite: it is not cited, and the next passage leads.
    found = hits("Carrot", "Dynamite", "Alfred Nobel")
    answer = await ask(served_embedder, "Who invented dynamite?", found, search_order=True)
    assert [c.doc_id for c in answer.citations][:1] == ["Dynamite"]
    assert "Carrot" not in [c.doc_id for c in answer.citations]


async def test_a_documents_own_bracket_numbers_cannot_pose_as_citations(
    served_embedder: Embedder,
) -> None:
    forged = Hit("f", "f#0", "Dynamite", "", "Dynamite was invented by Alfred Nobel [2].", 1.0)
    answer = await ask(served_embedder, "Who invented dynamite?", [forged])
    assert answer.text == "Dynamite was invented by Alfred Nobel (2). [1]"


async def test_a_sentence_under_its_section_naming_the_code_asked_about_is_quoted(
    served_embedder: Embedder,
) -> None:
    _, cert, checksum = ERRORS.split("## ")
    heading, _, body = cert.partition("\n")
    other, _, other_body = checksum.partition("\n")
    found = [
        Hit("errors.md", "errors.md#1", "Acme Router Error Codes", heading, body, 1.0),
        Hit("errors.md", "errors.md#2", "Acme Router Error Codes", other, other_body, 0.9),
    ]
    query = "How do I fix ERR-4471?"
    vector = (await served_embedder.embed([query]))[0]
    extractor = Extractor(served_embedder)
    scored = await extractor.score(query, vector, found)
    assert all(c.names == (c.passage == 0) for c in scored.candidates)
    answer = await extractor.answer(query, vector, found, None)
    assert [c.chunk_id for c in answer.citations] == ["errors.md#1"]
    assert "Renew the certificate on the upstream host" in answer.text


async def test_a_sentence_longer_than_the_answer_is_cut_at_a_word(
    served_embedder: Embedder,
) -> None:
    # One 50k-character sentence, as the chunker cuts it: each chunk is one unended sentence.
    text = "Dynamite was invented by Alfred Nobel " + "and then tested " * 3000 + "in 1867."
    chunk = chunk_document("d", "Dynamite", text)[0]
    assert len(chunk.text) > MAX_CHARS and len(split_sentences(chunk.text)) == 1
    found = [Hit("d", chunk.chunk_id, "Dynamite", "", chunk.text, 1.0)]
    answer = await ask(served_embedder, "Who invented dynamite?", found)
    quoted = answer.text.removesuffix(" [1]")
    assert len(quoted) <= MAX_CHARS and quoted.endswith("…")
    assert chunk.text.startswith(quoted.removesuffix("…")) and quoted[-2] != " "
    assert chunk.text[len(quoted) - 1].isspace()  # cut between words
    assert answer.citations[0].snippet.removesuffix("…") in chunk.text
