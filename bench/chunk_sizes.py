"""Chunk sizes of the Wikipedia sample (or files given), by the model's own tokenizer: the word
estimate at its 350 target (`fit_window: false`) vs chunks fitted to the embedder's 256-token
window (the default).

    .venv/bin/python bench/chunk_sizes.py [paths ...]

Sizes are what the encoder is given: context line, separator, chunk, [CLS] and [SEP]. A chunk
over 256 tokens is cut by the encoder: its tail is in the BM25 index but not in its vector.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.embeddings.minilm import MiniLMEmbedder, default_model_path, load_tokenizer
from gateway.ingest.chunker import ChunkingConfig, approx_tokens, chunk_document
from gateway.ingest.readers import read_paths
from gateway.ingest.wiki_sample import load_wiki_sample


def main() -> int:
    paths = [Path(p) for p in sys.argv[1:]]
    docs = list(read_paths(paths)) if paths else load_wiki_sample()
    window = MiniLMEmbedder().token_window
    whole = load_tokenizer(default_model_path(), None)
    estimated = ChunkingConfig(fit_window=False)
    print(f"{len(docs):,} documents; window {window.max_tokens} tokens incl. [CLS]/[SEP]")
    print(f"{'chunking':34} {'chunks':>7} {'p50':>5} {'p95':>5} {'max':>6} {'> window':>9}")
    for name, kwargs in (
        ("word estimate, target 350", {"config": estimated, "count": approx_tokens}),
        ("model tokenizer, window 256", {"window": window}),
    ):
        texts = [
            c.embedding_text
            for d in docs
            for c in chunk_document(d.doc_id, d.title, d.text, **kwargs)  # type: ignore[arg-type]
        ]
        sizes = np.array([len(e.ids) for e in whole.encode_batch(texts)])
        over = int((sizes > window.max_tokens).sum())
        print(
            f"{name:34} {len(sizes):7,} {np.percentile(sizes, 50):5.0f} "
            f"{np.percentile(sizes, 95):5.0f} {sizes.max():6,} {over:5,} ({over / len(sizes):.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
