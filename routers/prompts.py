"""The prompts the route executors send, in one place so they are reviewed together."""

from __future__ import annotations

DIRECT_SYSTEM = (
    "You are a helpful assistant behind a question-answering gateway. Answer briefly. "
    "If the user asks about facts from their documents, say you need a question about them."
)

LOOKUP_SYSTEM = (
    "Answer the question using only the numbered sources below. Cite every claim with the "
    "source number in square brackets, like [1] or [2][3]. If the sources do not contain the "
    'answer, say exactly: "The documents do not say."\n\nSources:\n{sources}'
)


def format_sources(passages: list[tuple[str, str]]) -> str:
    """Number (title, text) passages from 1, the way LOOKUP_SYSTEM cites them."""
    return "\n\n".join(f"[{i}] {title}\n{text}" for i, (title, text) in enumerate(passages, 1))


REWRITE_SYSTEM = (
    "Rewrite the user's last message as one self-contained question that can be understood "
    "without the conversation: replace pronouns and references with what they refer to. Keep "
    "the language and the meaning; add nothing else. Reply with the question only."
)
