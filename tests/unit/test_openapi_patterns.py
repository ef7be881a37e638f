"""docs/openapi.yaml's text patterns are gateway/text.py's rules: the document is what
scripts/make_openapi_patterns.py renders, and each pattern agrees with the server's own check
on every character and on whole ids."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import pytest
import yaml

from gateway.text import InvalidText, clean_text, doc_id, is_blank
from tests.fixtures.gateway import REPO_ROOT

DOC = REPO_ROOT / "docs" / "openapi.yaml"
SCHEMAS = yaml.safe_load(DOC.read_text(encoding="utf-8"))["components"]["schemas"]


def script() -> ModuleType:
    path = REPO_ROOT / "scripts" / "make_openapi_patterns.py"
    spec = importlib.util.spec_from_file_location("make_openapi_patterns", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pattern(name: str) -> re.Pattern[str]:
    return re.compile(SCHEMAS[name]["pattern"])


def test_the_document_holds_the_patterns_the_script_renders() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert script().render(doc) == doc, "run: python scripts/make_openapi_patterns.py"


def test_non_blank_text_matches_exactly_the_characters_that_are_content() -> None:
    nonblank = pattern("NonBlankText")
    wrong = [
        hex(cp)
        for cp in range(sys.maxunicode + 1)
        if not 0xD800 <= cp < 0xE000
        and bool(nonblank.search(chr(cp))) == is_blank(clean_text(chr(cp)))
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "text",
    ["hello", " \u200b\t", "\x00\x01", "\u0301", "e\u0301", "\u3164", "\u115fa", "\n\r ", "中"],
)
def test_non_blank_text_agrees_with_the_server_on_whole_texts(text: str) -> None:
    assert bool(pattern("NonBlankText").search(text)) == (not is_blank(clean_text(text)))


def accepted(value: str) -> bool:
    """The server takes `value` as an id (in its NFC form)."""
    try:
        doc_id(value)
    except InvalidText:
        return False
    return True


@pytest.mark.parametrize(
    "value",
    [
        "a.md",
        "a/b/c.txt",
        "caf\u00e9",
        "a b",
        " a",
        "a ",
        "a\u00a0",
        "/a",
        "a/",
        "a//b",
        ".",
        "..",
        "./a",
        "a/../b",
        "a/.b",
        "cafe\u0301",
        "...",
        "a\x00b",
        "a\u200bb",
        "a\ue000",
        "a\u0378",
        "a\u2028b",
        "😀",
        "a" * 512,
        "a" * 513,
        "",
    ],
)
def test_document_id_agrees_with_the_server(value: str) -> None:
    assert bool(pattern("DocumentId").search(value)) == accepted(value)


def test_document_id_refuses_exactly_the_characters_the_server_refuses_inside_an_id() -> None:
    inner = re.compile(SCHEMAS["DocumentId"]["pattern"].rsplit("[^", 1)[1].split("]{", 1)[0])
    klass = re.compile(f"[{inner.pattern}]")
    wrong = [
        hex(cp)
        for cp in range(sys.maxunicode + 1)
        if not 0xD800 <= cp < 0xE000 and bool(klass.fullmatch(chr(cp))) == accepted(f"a{chr(cp)}a")
    ]
    assert wrong == []
