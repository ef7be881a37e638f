"""Recursive chunking: headings, then paragraphs, then sentences, then words.

Each chunk stays within one section, so it can name its heading path, and holds at most
`target_tokens`; consecutive chunks of a section overlap by about `overlap` of that, so a fact
cut at a boundary is still whole in one of them. Ids are `<doc_id>#<n>`: stable as long as the
text and the settings are.

Given the embedder's `TokenWindow` (MiniLM: 256 tokens with [CLS] and [SEP]), chunks are
counted with the embedder's own tokenizer and sized so that what is embedded, the context line
plus the chunk, fits the window whole: an encoder silently drops what lies past its window, so
the tail of a larger chunk would be searchable by BM25 but invisible to the dense arm. A word
longer than the window on its own (a URL, a base64 blob) is cut into pieces that fit. Without a
window (a remote embedding API) sizes are estimated from words (`approx_tokens`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from backends.embeddings.base import TokenWindow

TokenCounter = Callable[[str], int]

# An ATX markdown heading line: its level and its text, the closing #s still on (see heading).
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+)$")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# A sentence ends at . ! or ? followed by whitespace; good enough for prose, and code or lists
# without punctuation fall through to the word level.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_APPROX_TOKEN = re.compile(r"\w+|[^\w\s]")
# Word pieces per (word or punctuation mark), measured with the MiniLM tokenizer on the
# Wikipedia sample: 1.10. Close enough for sizing chunks, and needs no tokenizer.
_PIECES_PER_TOKEN = 1.1
SECTION_SEPARATOR = " > "
CONTEXT_SEPARATOR = "\n\n"  # between the context line and the chunk in what is embedded


def approx_tokens(text: str) -> int:
    return round(len(_APPROX_TOKEN.findall(text)) * _PIECES_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class ChunkingConfig:
    target_tokens: int = 350
    overlap: float = 0.12
    # Size chunks by the embedder's tokenizer to fit its window (context line included), when
    # the embedder has one. Part of the config's repr, so indexes keyed by it are rebuilt.
    fit_window: bool = True


DEFAULT_CHUNKING = ChunkingConfig()


@dataclass(frozen=True, slots=True)
class TextChunk:
    chunk_id: str
    text: str
    section: str  # heading path, outermost first; "" before the first heading
    context: str  # "title — section": what the chunk is about, for embedding and indexing

    @property
    def embedding_text(self) -> str:
        return f"{self.context}{CONTEXT_SEPARATOR}{self.text}"


@dataclass(frozen=True, slots=True)
class _Piece:
    text: str
    joiner: str  # how it attaches to the piece before it
    tokens: int  # count(text): for guessing how many pieces fit a chunk (see _merge)


def chunk_document(
    doc_id: str,
    title: str,
    text: str,
    config: ChunkingConfig = DEFAULT_CHUNKING,
    count: TokenCounter = approx_tokens,
    *,
    window: TokenWindow | None = None,
) -> list[TextChunk]:
    """The document's chunks; with `window`, each chunk's `embedding_text` fits it whole."""
    return list(iter_chunks(doc_id, title, text, config, count, window=window))


def iter_chunks(
    doc_id: str,
    title: str,
    text: str,
    config: ChunkingConfig = DEFAULT_CHUNKING,
    count: TokenCounter = approx_tokens,
    *,
    window: TokenWindow | None = None,
) -> Iterator[TextChunk]:
    """`chunk_document`'s chunks one at a time, each made only when asked for: a caller that
    refuses a document past some number of chunks stops paying for it there."""
    if window is not None:
        count = window.count
    made = 0
    for path, body in sections(text, title):
        section = SECTION_SEPARATOR.join(path)
        context = f"{title} — {section}" if section else title
        section_config = config
        if window is not None:
            # A long title or heading path may take at most a quarter of the window.
            context = _fit(context, window.text_tokens // 4, count)
            room = window.text_tokens - count(f"{context}{CONTEXT_SEPARATOR}")
            section_config = ChunkingConfig(min(config.target_tokens, room), config.overlap)
        for part in _chunk_section(body, section_config, count):
            yield TextChunk(f"{doc_id}#{made}", part, section, context)
            made += 1


def _fit(text: str, budget: int, count: TokenCounter) -> str:
    """`text` cut at a word (or, for one long word, a character) to at most `budget` tokens."""
    if count(text) <= budget:
        return text
    words = text.split()
    # The most words that fit, at least one, searched for: dropping them one at a time and
    # counting the rest each time is quadratic in a long heading's length.
    kept = max(1, _longest(len(words), lambda k: count(" ".join(words[:k])) <= budget))
    return _cut(" ".join(words[:kept]), budget, count)[0]


def _longest(n: int, fits: Callable[[int], bool]) -> int:
    """The largest k in [0, n] with `fits(k)`, for a `fits` true at 0 that stays false once
    false as k grows (a count of more whole words joined by white space never shrinks): by
    doubling, then bisection, so a search costs about twice counting the answer, not the
    answer's square (words counting no tokens, e.g. zero-width spaces, fit without end)."""
    low, step = 0, 1
    while low < n:
        probe = min(low + step, n)
        if not fits(probe):
            high = probe
            while high - low > 1:
                middle = (low + high) // 2
                if fits(middle):
                    low = middle
                else:
                    high = middle
            return low
        low, step = probe, step * 2
    return low


def _cut(text: str, budget: int, count: TokenCounter) -> list[str]:
    """`text` in consecutive pieces of at most `budget` tokens each (by bisection on length):
    for a single word longer than a chunk, which no separator splits.

    Each piece's bisection starts from a prefix found by doubling, not from the whole rest:
    tokenizing the rest for every piece is quadratic in the word's length."""
    pieces: list[str] = []
    while text:
        low, high = 1, min(len(text), max(budget, 2))
        while count(text[:high]) <= budget:
            if high == len(text):
                pieces.append(text)
                return pieces
            low, high = high, min(len(text), high * 2)
        # The longest prefix that fits lies in [low, high).
        while high - low > 1:
            middle = (low + high) // 2
            if count(text[:middle]) <= budget:
                low = middle
            else:
                high = middle
        pieces.append(text[:low])
        text = text[low:]
    return pieces


def sections(text: str, title: str) -> list[tuple[tuple[str, ...], str]]:
    """(heading path, body) per markdown section with a non-empty body.

    A top heading that only repeats the title is left out of the path: it says nothing new.
    """
    out: list[tuple[tuple[str, ...], str]] = []
    path: list[tuple[int, str]] = []
    lines: list[str] = []

    def flush() -> None:
        body = "\n".join(lines).strip()
        if body:
            names = tuple(name for _, name in path)
            if names and names[0] == title:
                names = names[1:]
            out.append((names, body))
        lines.clear()

    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code  # a '#' inside a code block is a comment, not a heading
        found = None if in_code else heading(line)
        if found is None:
            lines.append(line)
            continue
        flush()
        level, name = found
        path = [(lvl, n) for lvl, n in path if lvl < level] + [(level, name)]
    flush()
    return out


def heading(line: str) -> tuple[int, str] | None:
    r"""(level, text) of a markdown heading line ("## Title ##" -> (2, "Title")), else None.

    The closing sequence is stripped here, not by the pattern: `(.+?)\s*#*\s*$` backtracks
    cubically on a long run of spaces, holding the GIL.
    """
    match = HEADING.match(line)
    if match is None:
        return None
    raw = match.group(2)
    return len(match.group(1)), raw.rstrip().rstrip("#").rstrip() or raw[:1]


def _chunk_section(body: str, config: ChunkingConfig, count: TokenCounter) -> Iterator[str]:
    pieces = _split(_Piece(body, "", count(body)), 0, config.target_tokens, count)
    return _merge(pieces, config, count)


_LEVELS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_PARAGRAPH_BREAK, "\n\n"),
    (_SENTENCE_END, " "),
    (re.compile(r"\s+"), " "),
)


def _split(piece: _Piece, level: int, target: int, count: TokenCounter) -> Iterator[_Piece]:
    """Pieces no larger than target, split at the coarsest level that gets them there; in
    order, each split only when the one before it was taken."""
    if piece.tokens <= target:
        yield piece
        return
    if level == len(_LEVELS):  # a single word longer than the target
        for i, part in enumerate(_cut(piece.text, target, count)):
            yield _Piece(part, piece.joiner if i == 0 else "", count(part))
        return
    pattern, joiner = _LEVELS[level]
    parts = [p.strip() for p in pattern.split(piece.text) if p.strip()]
    if len(parts) == 1:
        yield from _split(piece, level + 1, target, count)
        return
    for i, part in enumerate(parts):
        first = _Piece(part, piece.joiner if i == 0 else joiner, count(part))
        yield from _split(first, level + 1, target, count)


def _merge(pieces: Iterator[_Piece], config: ChunkingConfig, count: TokenCounter) -> Iterator[str]:
    """Greedy packing of pieces into chunks of at most target tokens, with overlap.

    The greedy rule: append the next piece while `count(chunk + joiner + piece)` stays within
    target. Counting every such candidate would make a chunk of n words cost n tokenizer passes
    over it; `_fitting` finds the same pieces with about three counts per chunk."""
    target = config.target_tokens
    buffer: list[_Piece] = []  # pieces read from `pieces` and not yet in a chunk
    current, tokens = "", 0  # the chunk being filled, and its count
    while buffer or (buffer := _take(pieces, 1)):
        if not current:
            first = buffer.pop(0)
            current, tokens = first.text, first.tokens
            continue
        taken, tokens = _fitting(current, tokens, buffer, pieces, target, count)
        if taken:
            current = _joined(current, buffer[:taken])
            del buffer[:taken]
            continue
        piece = buffer.pop(0)  # does not fit: the chunk is done
        yield current
        tail = _tail(current, round(target * config.overlap), count)
        start = f"{tail} {piece.text}" if tail else piece.text
        # Overlap is a nicety; the size limit is not.
        tokens = count(start)
        current, tokens = (start, tokens) if tokens <= target else (piece.text, piece.tokens)
    if current:
        yield current


def _take(source: Iterator[_Piece], n: int) -> list[_Piece]:
    out: list[_Piece] = []
    for piece in source:
        out.append(piece)
        if len(out) >= n:
            break
    return out


def _joined(current: str, pieces: list[_Piece]) -> str:
    return current + "".join(f"{p.joiner}{p.text}" for p in pieces)


def _fitting(
    current: str,
    tokens: int,
    buffer: list[_Piece],
    source: Iterator[_Piece],
    target: int,
    count: TokenCounter,
) -> tuple[int, int]:
    """How many of the next pieces (`buffer`, then `source`, read into `buffer` as needed)
    the greedy rule appends to `current`: trying them one by one, it stops at the first m with
    `count(current + pieces[:m]) > target`.

    Only a run of pieces joined by white space is searched: appending a word after white
    space never lowers a count (a tokenizer splits there, so the text before keeps its
    tokens), so the pieces that fit are a prefix of the run. The pieces' own counts, summed,
    guess its length (exact for a tokenizer that splits at white space); counting with that
    many and with one more confirms the guess, and a wrong one is corrected by doubling and
    bisection. A piece glued to the one before it (the pieces of a word cut to fit) can change
    how that word is tokenized: it ends the run, and is tried on its own next.

    Returns that number and the count of `current` with them appended (`tokens`: its own)."""
    end = 1  # buffer[:end] is the run so far; buffer is never empty here

    def run_end(limit: int) -> int:
        """The run's length, read up to `limit` pieces (fewer when a glued piece ends it or
        the section does)."""
        nonlocal end
        if len(buffer) < limit:
            buffer.extend(_take(source, limit - len(buffer)))
        while end < min(limit, len(buffer)) and buffer[end].joiner:
            end += 1
        return end

    counted = {0: tokens}

    def fits(m: int) -> bool:
        counted[m] = count(_joined(current, buffer[:m]))
        return counted[m] <= target

    room, guess = target - tokens, 0
    while guess < run_end(guess + 1) and buffer[guess].tokens <= room:
        room -= buffer[guess].tokens
        guess += 1
    if guess and not fits(guess):
        low, high = 0, guess  # appending nothing fits, `guess` pieces do not
    elif guess == run_end(guess + 1) or not fits(guess + 1):
        return guess, counted[guess]
    else:
        low, step = guess + 1, 1  # `low` pieces fit: double until some do not
        while True:
            probe = min(low + step, run_end(low + step))
            if probe == low:
                return low, counted[low]  # the whole run fits
            if not fits(probe):
                high = probe
                break
            low, step = probe, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, counted[low]


def _tail(text: str, budget: int, count: TokenCounter) -> str:
    """The end of a chunk to repeat at the start of the next: whole sentences if they fit."""
    # The most sentences (else words) from the end that fit, searched for: adding them one by
    # one and counting each time is quadratic in what counts no tokens (zero-width spaces).
    sentences = _SENTENCE_END.split(text)
    n = len(sentences)
    kept = _longest(n, lambda k: count(" ".join(sentences[n - k :])) <= budget)
    if kept:
        return " ".join(sentences[n - kept :])
    words = text.split()
    n = len(words)
    kept = _longest(n, lambda k: count(" ".join(words[n - k :])) <= budget)
    return " ".join(words[n - kept :])
