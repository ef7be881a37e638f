"""Which answers may be stored: complete, confident and not escalated, nothing else.

An answer from the cache is served without any of the checks that made it, so only answers
that would be right to give again go in. Refused, with the reason (a short tag for the log):

- `incomplete`: `Answer.complete` is false: cut at the token limit, a "not enough evidence" or
  "the documents do not say" abstention, an answer from sources that cites none, a direct answer
  with no model configured, the agent's plain answer at a cap;
- `escalated`: the lookup did not trust its own evidence, whatever the agent then wrote;
- `capped`: the agent loop stopped at one of its caps (its forced answer may be partial);
- `abstention`: the text says it cannot answer, whichever route wrote it: the routes' own
  abstentions anywhere in it, or a model's refusal at its start ("I don't know", "I can't
  access real-time data", "As an AI …", `_REFUSAL_OPENINGS`);
- `tool_calls`: the model called the client's tools, or stopped for any reason but the end
  of its answer.

An answer whose model also cited sources it was not given is stored as it was served: those
citations are removed and the answer says so (routers.generation.finish), and it still cites a
source it was given (else it is not complete).

Errors never reach this point (nothing is stored for a request that failed), and a stream is
judged once it has completed: a stream that failed or whose client left is never stored.
"""

from __future__ import annotations

from typing import Literal

from routers.generation import NOT_FOUND
from routers.lookup import NO_EVIDENCE_TEXT
from routers.types import Answer

_ABSTENTIONS = (NOT_FOUND.casefold(), NO_EVIDENCE_TEXT.casefold(), "not enough evidence")
# How a model's refusal starts (apostrophes straightened, case folded); read at the start of the
# answer only (after an optional apology), so an answer that merely mentions them is stored.
_REFUSAL_OPENINGS = (
    "i don't know",
    "i do not know",
    "i'm not sure",
    "i am not sure",
    "i can't",
    "i cannot",
    "i can not",
    "i'm unable",
    "i am unable",
    "i'm not able",
    "i am not able",
    "i don't have",
    "i do not have",
    "as an ai",
    "unfortunately, i",
    "there is no information",
    "i have no information",
)
_APOLOGIES = ("i'm sorry", "i am sorry", "sorry")


# Why an answer is not stored: a metric label (querygate_cache_not_stored_total).
Refusal = Literal["escalated", "capped", "tool_calls", "incomplete", "abstention"]


def refusal(answer: Answer) -> Refusal | None:
    """Why `answer` may not be stored, or None when it may."""
    if answer.escalated or answer.escalation_reason is not None:
        return "escalated"
    if answer.cap is not None:
        return "capped"
    if answer.tool_calls or answer.finish_reason != "stop":
        return "tool_calls" if answer.tool_calls else "incomplete"
    if not answer.complete:
        return "incomplete"
    text = answer.text.casefold()
    if not text.strip() or any(a in text for a in _ABSTENTIONS) or _refuses(text):
        return "abstention"
    return None


def _refuses(text: str) -> bool:
    """The answer opens with a refusal, after an optional apology."""
    opening = " ".join(text.replace("\u2019", "'").split())[:80]
    for apology in _APOLOGIES:
        if opening.startswith(apology):
            opening = opening[len(apology) :].lstrip(" ,.!").removeprefix("but ")
            break
    return opening.startswith(_REFUSAL_OPENINGS)
