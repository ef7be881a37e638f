"""Schemathesis hooks for tests/e2e/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

One rule of the chat endpoint is in docs/openapi.yaml's prose, not its schema, because JSON
Schema cannot address "the last user message": the question is the last user message, not
blank, and after it come only the model's tool calls and their results, ending with a result.
A positive case that breaks it is made to keep it by asking one more question at the end; a
negative case is sent as generated. This rule is written here from the document, not taken
from the server's code, so a server that refuses a conversation the document allows still
fails the run.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import schemathesis

QUESTION = {"role": "user", "content": "What does the Acme warranty exclude?"}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _visible(text: str) -> bool:
    """Not blank as the document's NonBlankText reads it (its pattern, one character)."""
    return any(
        not c.isspace() and unicodedata.category(c) not in {"Cc", "Cf", "Mn", "Mc", "Me"}
        for c in text
        if c not in "\u115f\u1160\u3164\uffa0"
    )


def _tool_turn(message: dict[str, Any]) -> bool:
    return message.get("role") == "tool" or (
        message.get("role") == "assistant" and bool(message.get("tool_calls"))
    )


def asks_a_question(messages: list[Any]) -> bool:
    """The document's rule for `messages`."""
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not _visible(_text(messages[users[-1]])):
        return False
    tail = messages[users[-1] + 1 :]
    return not tail or (all(_tool_turn(m) for m in tail) and tail[-1].get("role") == "tool")


@schemathesis.hook("map_case").apply_to(path="/v1/chat/completions")
def ask_a_question(ctx: Any, case: Any) -> Any:
    body = case.body
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    messages = body.get("messages") if isinstance(body, dict) else None
    if positive and isinstance(messages, list) and not asks_a_question(messages):
        case.body = {**body, "messages": [*messages, QUESTION]}
    return case
