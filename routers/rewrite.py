"""Follow-up rewriting: "and its population?" → "What is the population of Paris?".

A follow-up is rewritten into a self-contained question (small model) before the cache, the
classifier and retrieval see it, since each of them reads the question alone. Only questions
that look like follow-ups pay for the call.
"""

from __future__ import annotations

import re

from backends.llm.base import LLM, Completion, LLMCall, Message
from routers.prompts import REWRITE_SYSTEM

_REFERENCE = re.compile(
    r"\b(it|its|it's|they|them|their|theirs|this|that|these|those|he|him|his|she|her|hers|"
    r"there|then|the same|the other|the former|the latter|above|previous|earlier)\b",
    re.IGNORECASE,
)
_CONTINUATION = re.compile(r"^\s*(and|but|also|so|what about|how about|why|why not)\b", re.I)
_SHORT_WORDS = 4
_MAX_TURNS = 6
_MAX_REWRITE_CHARS = 1000


def looks_like_followup(query: str, history: tuple[Message, ...]) -> bool:
    if not any(m.role == "user" for m in history):
        return False
    return bool(
        _REFERENCE.search(query) or _CONTINUATION.match(query) or len(query.split()) <= _SHORT_WORDS
    )


async def rewrite_followup(llm: LLM, query: str, history: tuple[Message, ...]) -> Completion:
    """The model's self-contained version; its text is "" when the answer is unusable (the
    call is paid for all the same, so its usage still counts)."""
    turns = [m for m in history if m.role in ("user", "assistant")][-_MAX_TURNS:]
    transcript = "\n".join(f"{m.role}: {m.content}" for m in turns)
    messages = (
        Message("system", REWRITE_SYSTEM),
        Message("user", f"Conversation:\n{transcript}\n\nLast message: {query}"),
    )
    completion = await llm.complete(LLMCall("small", messages, max_tokens=128, route="rewrite"))
    text = completion.text.strip().strip('"')
    # Cut at the token limit, the question is likely cut mid-way: the original asks better.
    if len(text) > _MAX_REWRITE_CHARS or completion.finish_reason == "length":
        text = ""
    return Completion(text, completion.tier, completion.model, completion.usage)
