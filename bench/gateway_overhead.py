"""Gateway throughput and latency on the embedded default, against the raw upstream, in one run.

    .venv/bin/python bench/gateway_overhead.py [--requests 300] [--concurrency 1 32]

Starts the fake OpenAI-compatible upstream and `querygate serve` (embedded index with the
tests/data corpus, in-process cache, small tier = the fake) as processes, then measures with an
aiohttp client on loopback:

  exact-hit   POST /v1/query, the same question again and again (cache hits)
  lookup      POST /v1/query, a new question each time: embed + retrieve + small model + store
  upstream    the same chat completion sent straight to the fake upstream (no gateway)

The gateway's own cost on a lookup is lookup minus upstream at equal concurrency. Everything
shares this machine's cores (client, gateway, upstream), so read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.gateway import KEYS, start_gateway, stop_gateway  # noqa: E402
from tests.fixtures.upstream import _await_ready_line  # noqa: E402

QUESTION = "How do I fix ERR-4471 on the Acme router?"


@dataclass
class Result:
    scenario: str
    concurrency: int
    latencies_s: list[float]
    wall_s: float
    errors: int

    def row(self) -> str:
        lat = sorted(self.latencies_s)
        p50 = statistics.median(lat) * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        rps = len(lat) / self.wall_s
        return (
            f"{self.scenario:<10} {self.concurrency:>4} {len(lat):>6} {rps:>9.1f} "
            f"{p50:>9.2f} {p99:>9.2f} {self.errors:>6}"
        )

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000


@contextmanager
def fake_upstream() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_upstream", "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield _await_ready_line(proc, time.monotonic() + 15) + "/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


Send = Callable[[aiohttp.ClientSession, int], Awaitable[bool]]


async def load(send: Send, requests: int, concurrency: int) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    errors = 0
    next_index = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal errors
            for i in next_index:
                start = time.perf_counter()
                ok = await send(session, i)
                latencies.append(time.perf_counter() - start)
                errors += not ok

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, time.perf_counter() - started, errors


def gateway_sender(url: str, unique: bool, run: str) -> Send:
    headers = {"Authorization": f"Bearer {KEYS['acme']}"}

    async def send(session: aiohttp.ClientSession, i: int) -> bool:
        text = f"{QUESTION} (case {run}-{i})" if unique else QUESTION
        async with session.post(f"{url}/v1/query", json={"query": text}, headers=headers) as r:
            await r.read()
            return r.status == 200

    return send


def upstream_sender(base: str) -> Send:
    body = {
        "model": "fake-small",
        "messages": [
            {"role": "system", "content": "Answer from the sources. [1] Acme Router Error Codes"},
            {"role": "user", "content": QUESTION},
        ],
    }

    async def send(session: aiohttp.ClientSession, i: int) -> bool:
        async with session.post(f"{base}/chat/completions", json=body) as r:
            await r.read()
            return r.status == 200

    return send


async def measure(url: str, upstream: str, requests: int, levels: list[int]) -> list[Result]:
    results = []
    # Warm: the first lookups pay one-off costs (connection pools, tokenizer caches).
    await load(gateway_sender(url, unique=True, run="warm"), 20, 4)
    await load(gateway_sender(url, unique=False, run="warm"), 2, 1)
    for concurrency in levels:
        scenarios: list[tuple[str, Send]] = [
            ("exact-hit", gateway_sender(url, unique=False, run="")),
            ("lookup", gateway_sender(url, unique=True, run=f"c{concurrency}")),
            ("upstream", upstream_sender(upstream)),
        ]
        for name, send in scenarios:
            latencies, wall, errors = await load(send, requests, concurrency)
            results.append(Result(name, concurrency, latencies, wall, errors))
    return results


def report(results: list[Result]) -> None:
    print(
        f"{'scenario':<10} {'conc':>4} {'n':>6} {'req/s':>9} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'errors':>6}"
    )
    for result in results:
        print(result.row())
    print()
    by = {(r.scenario, r.concurrency): r for r in results}
    for concurrency in sorted({r.concurrency for r in results}):
        lookup, upstream = by[("lookup", concurrency)], by[("upstream", concurrency)]
        hit = by[("exact-hit", concurrency)]
        print(
            f"concurrency {concurrency}: lookup p50 / upstream p50 = "
            f"{lookup.p50_ms / upstream.p50_ms:.1f}x "
            f"(gateway adds {lookup.p50_ms - upstream.p50_ms:.2f} ms); "
            f"exact-hit p50 / upstream p50 = {hit.p50_ms / upstream.p50_ms:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    with fake_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        gateway = start_gateway(Path(tmp), upstream)
        try:
            results = asyncio.run(measure(gateway.url, upstream, args.requests, args.concurrency))
        finally:
            stop_gateway(gateway)
    report(results)


if __name__ == "__main__":
    main()
