"""Recursive chunking: headings, then paragraphs, then sentences, then words.

Each chunk stays within one section, so it can name its heading path, and holds at most
`target_tokens`; consecutive chunks of a section overlap by about `overlap` of that, so a fact
cut at a boundary is still whole in one of them. Ids are `<doc_id>#<n>`: stable as long as the
text and the settings are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

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


def approx_tokens(text: str) -> int:
    return round(len(_APPROX_TOKEN.findall(text)) * _PIECES_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class ChunkingConfig:
    target_tokens: int = 350
    overlap: float = 0.12


DEFAULT_CHUNKING = ChunkingConfig()


@dataclass(frozen=True, slots=True)
class TextChunk:
    chunk_id: str
    text: str
    section: str  # heading path, outermost first; "" before the first heading
    context: str  # "title — section": what the chunk is about, for embedding and indexing

    @property
    def embedding_text(self) -> str:
        return f"{self.context}\n\n{self.text}"


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
) -> list[TextChunk]:
    chunks: list[TextChunk] = []
    for path, body in sections(text, title):
        section = SECTION_SEPARATOR.join(path)
        context = f"{title} — {section}" if section else title
        for part in _chunk_section(body, config, count):
            chunks.append(TextChunk(f"{doc_id}#{len(chunks)}", part, section, context))
    return chunks


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
    if count(piece.text) <= target or level == len(_LEVELS):
        return [piece]  # a single word longer than the target stays whole
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
