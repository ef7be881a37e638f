"""OpenSearch write throughput: one document per call against batched `upsert_documents`.

    .venv/bin/python bench/opensearch_writes.py [--docs 1000] [--batch 100] [--url URL]

Needs a node (`scripts/opensearch.sh start`). Writes synthetic one-chunk documents (random unit
vectors, so no embedding cost) to a fresh alias, first one at a time, then the same documents
changed, in batches; drops the alias at the end. Both runs write every document.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import numpy as np

from backends.retrieval.base import Chunk, Document
from backends.retrieval.opensearch import OpenSearchConfig, OpenSearchRetriever


def documents(n: int, rev: int) -> list[Document]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        vector = rng.standard_normal(384).astype(np.float32)
        vector /= np.linalg.norm(vector)
        chunk = Chunk(f"d{i}#0", f"text of document {i}", "body", vector)
        out.append(Document(f"d{i}", f"Doc {i}", f"h{i}-{rev}", (chunk,)))
    return out


async def run(args: argparse.Namespace) -> None:
    alias = f"bench-writes-{uuid.uuid4().hex[:6]}"
    retriever = OpenSearchRetriever(OpenSearchConfig(hosts=(args.url,), alias=alias))
    try:
        started = time.perf_counter()
        for document in documents(args.docs, 1):
            await retriever.upsert_document("bench", document)
        single = time.perf_counter() - started
        batch = documents(args.docs, 2)
        started = time.perf_counter()
        for i in range(0, args.docs, args.batch):
            await retriever.upsert_documents("bench", batch[i : i + args.batch])
        batched = time.perf_counter() - started
    finally:
        await retriever.drop_all()
        await retriever.aclose()
    print(f"{args.docs} one-chunk documents on {args.url}")
    print(f"one at a time     {single:7.1f} s  {args.docs / single:7.0f} docs/s")
    print(f"batches of {args.batch:<5}  {batched:7.1f} s  {args.docs / batched:7.0f} docs/s")
    print(f"batched / one at a time: {single / batched:.1f}x faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--url", default="http://127.0.0.1:9200")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
