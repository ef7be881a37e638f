"""The cached form of an answer: what the response cache stores and reads back."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from routers.types import Answer, Citation, Route


def answer_to_cache(answer: Answer, route_reason: str) -> dict[str, Any]:
    return {
        "answer": answer.text,
        "route": answer.route.value,
        "route_reason": route_reason,
        "escalated": answer.escalated,
        "extractive": answer.extractive,
        "citations": [asdict(c) for c in answer.citations],
    }


def answer_from_cache(payload: dict[str, Any]) -> tuple[Answer, str]:
    """A cached answer costs nothing now: its usage is empty. Raises ValueError for a payload
    that is not one `answer_to_cache` wrote."""
    try:
        answer = Answer(
            text=str(payload["answer"]),
            route=Route(payload["route"]),
            citations=tuple(Citation(**c) for c in payload["citations"]),
            extractive=bool(payload["extractive"]),
            escalated=bool(payload["escalated"]),
        )
        return answer, str(payload["route_reason"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a cached answer: {exc!r}") from exc
