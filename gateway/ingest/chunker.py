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
from collections.abc import Callable
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
    if window is not None:
        count = window.count
    chunks: list[TextChunk] = []
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
            chunks.append(TextChunk(f"{doc_id}#{len(chunks)}", part, section, context))
    return chunks


def _fit(text: str, budget: int, count: TokenCounter) -> str:
    """`text` cut at a word (or, for one long word, a character) to at most `budget` tokens."""
    if count(text) <= budget:
        return text
    words = text.split()
    while len(words) > 1 and count(" ".join(words)) > budget:
        words.pop()
    return _cut(" ".join(words), budget, count)[0]


def _cut(text: str, budget: int, count: TokenCounter) -> list[str]:
    """`text` in consecutive pieces of at most `budget` tokens each (by bisection on length):
    for a single word longer than a chunk, which no separator splits.

    Each piece's bisection starts from a prefix found by doubling, not from the whole rest:
    tokenizing the rest for every piece was quadratic (a 60,000-character "a-a-..." took
    6.7 CPU-seconds, 500,000 characters minutes)."""
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

    The closing sequence is stripped here, not by the pattern: `(.+?)\s*#*\s*$` backtracked
    cubically on a long run of spaces (a heading line with 8,000 took minutes, holding the GIL).
    """
    match = HEADING.match(line)
    if match is None:
        return None
    raw = match.group(2)
    return len(match.group(1)), raw.rstrip().rstrip("#").rstrip() or raw[:1]


def _chunk_section(body: str, config: ChunkingConfig, count: TokenCounter) -> list[str]:
    pieces = _split(_Piece(body, ""), 0, config.target_tokens, count)
    return _merge(pieces, config, count)


_LEVELS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_PARAGRAPH_BREAK, "\n\n"),
    (_SENTENCE_END, " "),
    (re.compile(r"\s+"), " "),
)


def _split(piece: _Piece, level: int, target: int, count: TokenCounter) -> list[_Piece]:
    """Pieces no larger than target, split at the coarsest level that gets them there."""
    if count(piece.text) <= target:
        return [piece]
    if level == len(_LEVELS):  # a single word longer than the target
        parts = _cut(piece.text, target, count)
        return [_Piece(p, piece.joiner if i == 0 else "") for i, p in enumerate(parts)]
    pattern, joiner = _LEVELS[level]
    parts = [p.strip() for p in pattern.split(piece.text) if p.strip()]
    if len(parts) == 1:
        return _split(piece, level + 1, target, count)
    out: list[_Piece] = []
    for i, part in enumerate(parts):
        first = _Piece(part, piece.joiner if i == 0 else joiner)
        out.extend(_split(first, level + 1, target, count))
    return out


def _merge(pieces: list[_Piece], config: ChunkingConfig, count: TokenCounter) -> list[str]:
    """Greedy packing of pieces into chunks of at most target tokens, with overlap."""
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        candidate = f"{current}{piece.joiner}{piece.text}" if current else piece.text
        if not current or count(candidate) <= config.target_tokens:
            current = candidate
            continue
        chunks.append(current)
        tail = _tail(current, round(config.target_tokens * config.overlap), count)
        start = f"{tail} {piece.text}" if tail else piece.text
        # Overlap is a nicety; the size limit is not.
        current = start if count(start) <= config.target_tokens else piece.text
    if current:
        chunks.append(current)
    return chunks


def _tail(text: str, budget: int, count: TokenCounter) -> str:
    """The end of a chunk to repeat at the start of the next: whole sentences if they fit."""
    sentences = _SENTENCE_END.split(text)
    tail = ""
    for sentence in reversed(sentences):
        longer = f"{sentence} {tail}" if tail else sentence
        if count(longer) > budget:
            break
        tail = longer
    if tail:
        return tail
    words = text.split()
    kept: list[str] = []
    for word in reversed(words):
        if count(" ".join([word, *kept])) > budget:
            break
        kept.insert(0, word)
    return " ".join(kept)
