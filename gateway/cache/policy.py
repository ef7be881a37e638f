"""Which answers may be stored: complete, confident and not escalated, nothing else.

An answer from the cache is served without any of the checks that made it, so only answers
that would be right to give again go in. Refused, with the reason (a short tag for the log):

- `incomplete`: `Answer.complete` is false: cut at the token limit, a "not enough evidence" or
  "the documents do not say" abstention, an answer from sources that cites none, a direct answer
  with no model configured, the agent's plain answer at a cap;
- `escalated`: the lookup did not trust its own evidence, whatever the agent then wrote;
- `capped`: the agent loop stopped at one of its caps (its forced answer may be partial);
- `abstention`: the text says it cannot answer, whichever route wrote it;
- `tool_calls`: the model called the client's tools, or stopped for any reason but the end
  of its answer.

An answer whose model also cited sources it was not given is stored as it was served: those
citations are removed and the answer says so (routers.generation.finish), and it still cites a
source it was given (else it is not complete).

Errors never reach this point (nothing is stored for a request that failed), and a stream is
judged once it has completed: a stream that failed or whose client left is never stored.
"""

from __future__ import annotations

from routers.generation import NOT_FOUND
from routers.lookup import NO_EVIDENCE_TEXT
from routers.types import Answer

_ABSTENTIONS = (NOT_FOUND.casefold(), NO_EVIDENCE_TEXT.casefold(), "not enough evidence")


def refusal(answer: Answer) -> str | None:
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
    if not text.strip() or any(a in text for a in _ABSTENTIONS):
        return "abstention"
    return None
