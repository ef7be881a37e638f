"""The embedded index shared by real processes: a writer SIGKILLed mid-PUT loses no acknowledged
write and leaves a log another process catches up from, and writers beside readers and another
writer never answer "database is locked"."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from backends.retrieval.base import SearchRequest
from backends.retrieval.embedded import EmbeddedRetriever
from tests.fixtures.documents import chunk_ids, make_doc
from tests.fixtures.embeddings import unit_vector

REPO = Path(__file__).resolve().parents[2]
# Writes documents of three chunks until killed, printing each id once its write returned.
WRITER = """
import asyncio, sys
from pathlib import Path
from backends.retrieval.embedded import EmbeddedRetriever
from tests.fixtures.documents import make_doc

async def main():
    async with EmbeddedRetriever(Path(sys.argv[1])) as index:
        n = 0
        while True:
            texts = [f"killed writer {n} part {i}" for i in range(3)]
            await index.upsert_document("t", make_doc(f"w{n}", texts, [n, n + 1, n + 2]))
            print(f"w{n}", flush=True)
            n += 1

asyncio.run(main())
"""
ACKNOWLEDGED = 25


async def dense_ids(index: EmbeddedRetriever) -> list[str]:
    request = SearchRequest("t", "", unit_vector(0), k=1000, mode="dense", candidates=1000)
    hits = await index.search(request)
    return sorted(chunk_ids(hits))


async def test_a_writer_killed_mid_put_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as reader:
        await reader.upsert_document("t", make_doc("seed", ["seed"], [0]))
        assert await dense_ids(reader) == ["seed#0"]  # loaded before the writer starts
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRITER,
            str(path),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.stdout is not None
        acknowledged = [
            (await proc.stdout.readline()).decode().strip() for _ in range(ACKNOWLEDGED)
        ]
        os.kill(proc.pid, signal.SIGKILL)  # mid-way through a later write
        await proc.wait()

        caught_up = await dense_ids(reader)
        async with EmbeddedRetriever(path) as fresh:
            reloaded = await dense_ids(fresh)
            stats = await fresh.stats("t")

    assert acknowledged == [f"w{n}" for n in range(ACKNOWLEDGED)]
    for doc_id in acknowledged:
        assert {f"{doc_id}#{i}" for i in range(3)} <= set(reloaded)
    # Whole documents only, and the reader's catch-up agrees with a whole load.
    assert stats == (1 + (len(reloaded) - 1) // 3, len(reloaded))
    assert caught_up == reloaded


async def test_writers_beside_readers_and_another_writer_are_never_locked_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as serve, EmbeddedRetriever(path) as ingest:

        async def write(index: EmbeddedRetriever, prefix: str) -> None:
            for n in range(30):
                await index.upsert_document("t", make_doc(f"{prefix}{n}", [f"{prefix} {n}"], [n]))

        async def read() -> None:
            for _ in range(30):
                await serve.search(SearchRequest("t", "serve ingest", unit_vector(1), k=5))

        await asyncio.gather(write(serve, "serve"), write(ingest, "ingest"), read(), read())
        assert await serve.stats("t") == (60, 60)
        assert len(await dense_ids(serve)) == 60
