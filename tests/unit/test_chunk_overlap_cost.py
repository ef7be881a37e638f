"""The chunker's cost stays linear in text that counts few or no tokens: a long heading (cut to
a quarter of the window for the context line) and a run of zero-width spaces at the end of a
chunk (the overlap repeated at the start of the next) were searched one word at a time, each
time tokenizing all that was kept: quadratic, minutes of CPU for one PUT of a few hundred KB.
Measured as the characters put through the real MiniLM tokenizer, over the text's length."""

from __future__ import annotations

from backends.embeddings.base import TokenWindow
from backends.embeddings.minilm import MiniLMEmbedder
from gateway.ingest.chunker import chunk_document


class Counted:
    """The real tokenizer's window, adding up the characters it is given."""

    def __init__(self, real: TokenWindow) -> None:
        self.tokenized = 0

        def count(text: str) -> int:
            self.tokenized += len(text)
            return real.count(text)

        self.window = TokenWindow(real.max_tokens, real.special_tokens, count)


def test_a_long_heading_is_cut_for_the_context_line_in_linear_time(
    minilm: MiniLMEmbedder,
) -> None:
    """8,000 one-letter words in a heading: the context line keeps the first ~60 of them.
    Dropping the last word and recounting the rest, over and over, put ~4,000 times the text
    through the tokenizer (5 CPU-seconds; a 500,000-character PUT: hours)."""
    text = "## " + "a " * 8_000 + "\n\nThe section's one sentence."
    counted = Counted(minilm.token_window)
    chunks = chunk_document("doc", "Doc", text, window=counted.window)
    ratio = counted.tokenized / len(text)
    assert ratio < 20, f"{ratio:.0f} times the text through the tokenizer"
    assert [c.text for c in chunks] == ["The section's one sentence."]
    context = chunks[0].context
    assert context.startswith("Doc — a a a ")
    assert minilm.token_window.count(context) <= minilm.token_window.text_tokens // 4


def test_a_chunk_ending_in_zero_width_spaces_overlaps_in_linear_time(
    minilm: MiniLMEmbedder,
) -> None:
    """250 words, then 12,000 zero-width spaces (each its own word, no token), then more words:
    the first chunk ends in the zero-width run, and its overlap (the most words from its end
    within 12% of the target) took every one of them, recounting all it had kept each time
    (~5,700 times the text through the tokenizer, 18 CPU-seconds for 49 KB)."""
    text = "word " * 250 + "\u200b " * 12_000 + "word " * 10
    counted = Counted(minilm.token_window)
    chunks = chunk_document("doc", "Doc", text, window=counted.window)
    ratio = counted.tokenized / len(text)
    assert ratio < 40, f"{ratio:.0f} times the text through the tokenizer"
    assert len(chunks) == 2
    assert sum(c.text.split().count("word") for c in chunks) > 260  # the overlap repeats some
    assert chunks[1].text.endswith("word " * 9 + "word")
