"""Client text normalised once at the edge: what is removed, what is refused, what is kept."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.http.handlers.documents import DocumentBody
from gateway.http.schemas import ChatBody, QueryBody
from gateway.text import InvalidText, canonical_doc_id, clean_text, doc_id


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain question?", "plain question?"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("a\r\nb\rc", "a\nb\nc"),
        ("nul\x00byte", "nulbyte"),
        ("bell\x07 esc\x1b del\x7f c1\x85\x9f", "bell esc del c1"),
        ("cafe\u0301", "caf\u00e9"),  # NFD to NFC
        ("emoji \U0001f600 stays", "emoji \U0001f600 stays"),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


@pytest.mark.parametrize("raw", ["\ud800", "ok \udfff", "a\udc80b"])
def test_a_lone_surrogate_is_refused(raw: str) -> None:
    with pytest.raises(InvalidText, match="surrogate"):
        clean_text(raw)


USER_SURROGATE = {"role": "user", "content": "\udc00"}


def _fields(exc: pytest.ExceptionInfo[ValidationError]) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in exc.value.errors()}


def test_request_models_clean_every_client_text() -> None:
    body = QueryBody.model_validate(
        {"query": "q\x00?", "history": [{"role": "user", "content": "e\u0301\x01"}]}
    )
    assert body.query == "q?" and body.history[0].content == "\u00e9"
    chat = ChatBody.model_validate(
        {
            "model": "auto",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x\x00"}]}],
        }
    )
    assert chat.messages[0].text() == "x"
    doc = DocumentBody.model_validate({"title": "T\x00", "text": "body\x1b"})
    assert (doc.title, doc.text) == ("T", "body")


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (QueryBody, {"query": "\ud800"}, "query"),
        (QueryBody, {"query": "\x00\x01"}, "query"),  # blank once cleaned
        (QueryBody, {"query": "q", "history": [USER_SURROGATE]}, "history.0.content"),
        (ChatBody, {"model": "auto", "messages": [USER_SURROGATE]}, "messages.0.content"),
        (DocumentBody, {"title": "\ud800", "text": "t"}, "title"),
        (DocumentBody, {"text": "\ud800"}, "text"),
    ],
)  # fmt: skip
def test_text_that_cannot_be_cleaned_names_its_field(
    model: type[QueryBody | ChatBody | DocumentBody], data: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(data)
    assert field in _fields(exc)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("a/b", "a/b"),
        ("a%2Fb", "a/b"),
        ("a%252Fb", "a%2Fb"),
        ("caf%C3%A9", "caf\u00e9"),
        ("cafe%CC%81", "caf\u00e9"),  # NFD to NFC
    ],
)
def test_a_document_id_has_one_canonical_form(raw: str, canonical: str) -> None:
    assert canonical_doc_id(raw) == canonical
    assert doc_id(canonical) == canonical


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("100%", "%XX escape"),
        ("%FF", "UTF-8"),
        ("a%00b", "no control"),
        ("a%E2%80%8Bb", "no control, format"),
        ("%20a", "whitespace"),
        ("a//b", "segment"),
        ("./a", "segment"),
        ("a" * 513, "1 to 512"),
        ("", "1 to 512"),
    ],
)
def test_a_document_id_breaking_a_rule_is_refused_naming_it(raw: str, rule: str) -> None:
    with pytest.raises(InvalidText, match=r"^doc_id: ") as refused:
        canonical_doc_id(raw)
    assert rule in str(refused.value)
