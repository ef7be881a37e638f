"""A tenant with a large embedded index floods a real `querygate serve`; what another tenant's
queries see, before and after a change, in one process and with `--workers 2`, in one run.

    nice -n 10 python bench/embedded_isolation.py [--chunks 60000] [--seconds 15]
        [--tree before=/path/to/other/checkout] [--tree after=.]

The flooder (acme) holds `--chunks` chunks built from the Wikipedia sample (its lead sections cut
into ~300-character pieces, cycled until the count is reached; every piece also holds the word
"gizmo"; random 384-d unit vectors, which cost the dense arm what MiniLM's would), plus the
tests/data corpora. The victim (globex) has the tests/data corpus only. Each tree serves a copy
of the same data directory; per tree and worker count, two phases: `quiet` (the victim alone:
two query loops, 50 ms apart) and `flood` (the same, while acme runs 8 query loops, half its
in-flight share, asking "gizmo" (a word in every chunk), and one loop of small PUTs, each a new
generation of its index). Printed: the victim's p50/p99 and statuses, the flooder's counts,
and the load average around each phase. The response cache is off: every query does the work.
First, in process with this checkout's code (`costs`): the common word's BM25 search with and
without the row budget, and a dense search after another process's write against a cold load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from backends.retrieval.base import Chunk, Document, SearchRequest  # noqa: E402
from backends.retrieval.embedded import EmbeddedRetriever  # noqa: E402
from backends.retrieval.embedded.lexical import LEXICAL_ROW_BUDGET  # noqa: E402
from gateway.ingest.wiki_sample import load_wiki_sample  # noqa: E402
from tests.fixtures.gateway import (  # noqa: E402
    KEYS,
    GatewayProcess,
    free_port,
    gateway_config,
    ingest_corpora,
    stop_gateway,
    wait_healthy,
)

COMMON = "gizmo"
PIECE_CHARS = 300
CHUNKS_PER_DOC = 10
DIMENSION = 384
OVERRIDES: dict[str, Any] = {"cache": {"backend": "off"}, "server": {"request_timeout_s": 30}}
FLOOD_QUERIES = 8  # half of the default tenant_max_inflight (16)
VICTIM_LOOPS = 2
NOTE_WORDS = ("fan", "cable", COMMON, "shipping")


def pieces(target: int) -> list[str]:
    """`target` ~300-character pieces of the sample's lead sections, each with the common word."""
    out: list[str] = []
    docs = load_wiki_sample()
    while len(out) < target:
        for doc in docs:
            words = doc.text.split()
            piece: list[str] = []
            for word in words:
                piece.append(word)
                if sum(len(w) + 1 for w in piece) >= PIECE_CHARS:
                    out.append(f"{COMMON} " + " ".join(piece))
                    piece = []
            if len(out) >= target:
                break
    return out[:target]


async def build_big_index(path: Path, chunks: int) -> None:
    rng = np.random.default_rng(7)
    texts = pieces(chunks)
    async with EmbeddedRetriever(path) as index:
        for start in range(0, len(texts), CHUNKS_PER_DOC):
            vectors = rng.standard_normal((CHUNKS_PER_DOC, DIMENSION)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            doc_id = f"wiki-{start // CHUNKS_PER_DOC}"
            part = texts[start : start + CHUNKS_PER_DOC]
            doc_chunks = tuple(
                Chunk(f"{doc_id}#{i}", text, "", vectors[i]) for i, text in enumerate(part)
            )
            await index.upsert_document("acme", Document(doc_id, doc_id, doc_id, doc_chunks))
        print(f"big index: acme {await index.stats('acme')} (documents, chunks)", flush=True)


async def timed_ms(call: Callable[[], Awaitable[object]], times: int) -> float:
    """Median wall time of `call` in ms."""
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def costs(path: Path) -> None:
    """This tree's costs behind the phases, in process on a copy of the big index: a lexical
    query of the common word with and without the row budget, and a process's next dense
    search after another process wrote one document, against a cold process's first."""
    vector = np.zeros(DIMENSION, dtype=np.float32)
    vector[0] = 1.0
    common = SearchRequest("acme", COMMON, vector, mode="bm25")
    dense = SearchRequest("acme", "", vector, mode="dense")
    for budget in (None, LEXICAL_ROW_BUDGET):
        async with EmbeddedRetriever(path, lexical_row_budget=budget) as index:
            ms = await timed_ms(lambda: index.search(common), 5)
        print(f"costs: bm25 {COMMON!r} at budget {budget}: {ms:.0f} ms", flush=True)
    n = 0

    async def write_then_search() -> None:
        nonlocal n
        n += 1
        chunk = Chunk(f"note#{n}", f"note {n}", "", vector)
        await writer.upsert_document("acme", Document("note", "note", f"h{n}", (chunk,)))
        await reader.search(dense)

    async def cold_search() -> None:
        async with EmbeddedRetriever(path) as cold:
            await cold.search(dense)

    async with EmbeddedRetriever(path) as reader, EmbeddedRetriever(path) as writer:
        await reader.search(dense)
        caught_up = await timed_ms(write_then_search, 5)
    reload = await timed_ms(cold_search, 3)
    print(
        f"costs: a write by another process, then a dense search: {caught_up:.0f} ms;"
        f" a cold process's first dense search (a whole load): {reload:.0f} ms",
        flush=True,
    )


def build_base(root: Path, chunks: int) -> Path:
    root.mkdir(parents=True)
    data = root / "data"
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(gateway_config(data, free_port(), None, None, None, {})))
    ingest_corpora(config)
    asyncio.run(build_big_index(data / "index.sqlite3", chunks))
    return data


def launch(tree: Path, workdir: Path, base: Path, workers: int) -> GatewayProcess:
    data = workdir / "data"
    shutil.copytree(base, data)
    port = free_port()
    config_path = workdir / "config.yaml"
    config = gateway_config(data, port, None, None, None, OVERRIDES)
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / "gateway.log"
    args = ["serve", "--workers", str(workers)] if workers > 1 else ["serve"]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(config_path), *args],
            cwd=tree,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)},
        )
    gw = GatewayProcess(f"http://127.0.0.1:{port}", proc, log_path, config_path)
    wait_healthy(gw)
    return gw


@dataclass
class Phase:
    victim: Counter[int] = field(default_factory=Counter)
    victim_s: list[float] = field(default_factory=list)
    flood: Counter[int] = field(default_factory=Counter)
    puts: Counter[int] = field(default_factory=Counter)

    def summary(self) -> str:
        lat = sorted(self.victim_s)
        p50 = statistics.median(lat) * 1000
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000
        return (
            f"victim p50 {p50:6.0f} ms p99 {p99:6.0f} ms n={len(lat)} {dict(self.victim)}; "
            f"flooder queries {dict(self.flood)} PUTs {dict(self.puts)}"
        )


async def phase(gw: GatewayProcess, seconds: float, flood: bool) -> Phase:
    result = Phase()
    stop_at = time.monotonic() + seconds
    rng = random.Random(11)
    timeout = aiohttp.ClientTimeout(total=60)
    acme = {"Authorization": f"Bearer {KEYS['acme']}"}
    globex = {"Authorization": f"Bearer {KEYS['globex']}"}
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def victim(i: int) -> None:
            n = 0
            while time.monotonic() < stop_at:
                body = {"query": f"How long is the warranty, case {i}-{n}?"}
                started = time.monotonic()
                async with session.post(f"{gw.url}/v1/query", json=body, headers=globex) as r:
                    await r.read()
                result.victim[r.status] += 1
                result.victim_s.append(time.monotonic() - started)
                await asyncio.sleep(0.05)
                n += 1

        async def flooder(i: int) -> None:
            n = 0
            while time.monotonic() < stop_at:
                body = {"query": f"{COMMON} {COMMON} case{i}x{n}"}
                async with session.post(f"{gw.url}/v1/query", json=body, headers=acme) as r:
                    await r.read()
                result.flood[r.status] += 1
                n += 1

        async def writer() -> None:
            n = 0
            while time.monotonic() < stop_at:
                words = " ".join(rng.choice(NOTE_WORDS) for _ in range(60))
                body = {"title": f"note {n}", "text": f"Note {n}. {words}."}
                url = f"{gw.url}/v1/documents/note-{n % 50}"
                async with session.put(url, json=body, headers=acme) as r:
                    await r.read()
                result.puts[r.status] += 1
                n += 1

        loops = [victim(i) for i in range(VICTIM_LOOPS)]
        if flood:
            loops += [flooder(i) for i in range(FLOOD_QUERIES)] + [writer()]
        await asyncio.gather(*loops)
    return result


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=60_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--workers", type=int, action="append", help="default: 1 and 2")
    parser.add_argument("--costs-only", action="store_true", help="skip the gateway phases")
    parser.add_argument(
        "--tree", action="append", help="name=path of a checkout to serve (default: after=.)"
    )
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in (args.tree or [f"after={REPO}"])]
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} cores, load avg {load()} at start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        base = build_base(root / "base", args.chunks)
        print(f"built in {time.perf_counter() - started:.0f} s", flush=True)
        shutil.copytree(base, root / "costs")
        asyncio.run(costs(root / "costs" / "index.sqlite3"))
        if args.costs_only:
            return
        for workers in args.workers or [1, 2]:
            for name, tree in trees:
                gw = launch(Path(tree).resolve(), root / f"{name}-{workers}", base, workers)
                try:
                    for flood in (False, True):
                        before = load()
                        result = asyncio.run(phase(gw, args.seconds, flood))
                        label = f"{name:>7} workers={workers} {'flood' if flood else 'quiet'}"
                        print(f"{label}: {result.summary()} (load {before} -> {load()})")
                        sys.stdout.flush()
                finally:
                    stop_gateway(gw)
    print(f"machine: load avg {load()} at end")


if __name__ == "__main__":
    main()
