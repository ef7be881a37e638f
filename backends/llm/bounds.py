"""How much of a model's reply the gateway reads: a byte cap and a token bound, per call.

An upstream may ignore `max_tokens`; what it sends past the call's own limit is never buffered
whole. Each call has a `ReplyBound`: tokens, the call's limit plus the tier's
`reply_token_margin` (the gateway's token count is an estimate of the upstream's), and bytes
read off the wire, in proportion to those tokens and never over the tier's `max_reply_bytes`.
A reply past either is cut there and marked (`Completion.cut`, `StreamDelta.cut`: "bytes" or
"tokens", with finish_reason "length"):

- a non-streamed body past the byte cap stops being read; its text is what the cut JSON held
  of the message's content (`salvaged_text`), its usage estimated;
- a non-streamed text past the token bound is cut to it (`fit_tokens`);
- a stream is metered delta by delta (`ReplyMeter`: the bytes of text and tool-call arguments,
  the tokens of the text) and on the wire (bytes read), and closed at the first bound it
  passes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from backends.llm.base import Cut, TierConfig

# Tokens of a text, as the gateway estimates them (`backends.llm.wire.count_tokens`).
Counter = Callable[[str], int]

# What a reply carries besides its tokens: the JSON of a body, the usage chunk of a stream.
OVERHEAD_BYTES = 64 * 1024
# A streamed token comes in a chunk of 200-300 bytes of JSON framing; a body's token is a few.
BYTES_PER_TOKEN = 512
# Tokens a bound allows past its margin: a short limit's estimate is the least exact.
SLACK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ReplyBound:
    max_bytes: int
    max_tokens: int


def reply_bound(config: TierConfig, limit: int) -> ReplyBound:
    """The bound of a call whose completion limit is `limit` tokens, on a tier's model."""
    tokens = math.ceil(limit * (1 + config.reply_token_margin)) + SLACK_TOKENS
    max_bytes = min(config.max_reply_bytes, OVERHEAD_BYTES + tokens * BYTES_PER_TOKEN)
    return ReplyBound(max_bytes, tokens)


@dataclass(slots=True)
class Reading:
    """One reply as it is read off the wire: bytes so far, and whether the cap cut it."""

    max_bytes: int
    read: int = 0
    cut: Cut | None = None

    def take(self, size: int) -> bool:
        """Count `size` more bytes read; False (and cut) once they pass the cap."""
        self.read += size
        if self.read > self.max_bytes:
            self.cut = "bytes"
        return self.cut is None


_CONTENT_KEY = re.compile(rb'"content"\s*:\s*"')
_BACKSLASH = 0x5C


def salvaged_text(prefix: bytes) -> str:
    """The message content that a chat completion's JSON body cut at `prefix` holds: its first
    `"content"` string, as far as it came ("" when it had not begun)."""
    key = _CONTENT_KEY.search(prefix)
    if key is None:
        return ""
    raw = _whole_escapes(_string_body(prefix, key.end()))
    try:
        text: str = json.loads('"' + raw.decode("utf-8", errors="ignore") + '"')
    except ValueError:  # not a JSON string (a bad escape): the cut body holds no text
        return ""
    if text and "\ud800" <= text[-1] <= "\udbff":
        text = text[:-1]  # half a surrogate pair: the cut fell between its halves
    return text


def _string_body(data: bytes, start: int) -> bytes:
    """The JSON string starting at `start`, up to its closing quote or the end of `data`."""
    end = start
    while (end := data.find(b'"', end)) != -1:
        if _escapes_next(data, start, end):
            end += 1
            continue
        return data[start:end]
    return data[start:]


def _escapes_next(data: bytes, start: int, at: int) -> bool:
    """Whether the byte at `at` is escaped: an odd run of backslashes before it."""
    run = at
    while run > start and data[run - 1] == _BACKSLASH:
        run -= 1
    return (at - run) % 2 == 1


def _whole_escapes(raw: bytes) -> bytes:
    """`raw` without an escape the cut split at its end (a lone backslash, a short \\u)."""
    slash = raw.rfind(b"\\", max(len(raw) - 6, 0))
    if slash == -1 or _escapes_next(raw, 0, slash):
        return raw
    escape = raw[slash:]
    whole = len(escape) >= 2 and (escape[1:2] != b"u" or len(escape) >= 6)
    return raw if whole else raw[:slash]


def fit_tokens(count: Counter, text: str, max_tokens: int) -> str | None:
    """`text` cut to about `max_tokens` tokens, or None when it fits. A token is at least one
    character, so a text no longer than the bound is not counted."""
    if len(text) <= max_tokens:
        return None
    tokens = count(text)
    if tokens <= max_tokens:
        return None
    while tokens > max_tokens:  # in proportion, again while a cut word still passes it
        text = text[: len(text) * max_tokens // tokens]
        tokens = count(text)
    return text


class ReplyMeter:
    """A streamed reply's deltas against its bound. Tokens are counted only when the text could
    have passed the bound (a token is at least one character), so a reply well inside it costs
    no count, and one near it a few."""

    def __init__(self, count: Counter, bound: ReplyBound) -> None:
        self._count = count
        self._bound = bound
        self._bytes = 0
        self._text: list[str] = []
        self._chars = 0
        self._count_at = bound.max_tokens  # characters of text at which tokens are counted
        self.cut: Cut | None = None

    def take(self, text: str, other_bytes: int = 0) -> str:
        """What of `text` (the next delta's; `other_bytes`: its tool-call arguments) stays
        inside the bound; `cut` says which bound the rest passed."""
        self._bytes += len(text.encode()) + other_bytes
        if self._bytes > self._bound.max_bytes:
            self.cut = "bytes"
            over = self._bytes - self._bound.max_bytes
            return text[: max(len(text) - over, 0)]
        self._text.append(text)
        self._chars += len(text)
        if self._chars <= self._count_at:
            return text
        so_far = "".join(self._text)
        tokens = self._count(so_far)
        if tokens <= self._bound.max_tokens:
            # the fewest characters that could pass the bound (one a token) before a count
            self._count_at = self._chars + self._bound.max_tokens - tokens
            return text
        self.cut = "tokens"
        fitted = fit_tokens(self._count, so_far, self._bound.max_tokens) or so_far
        return text[: max(len(fitted) - (self._chars - len(text)), 0)]
