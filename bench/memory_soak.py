"""A worker's memory over a long run of distinct questions from many tenants: the curve.

    python bench/memory_soak.py [--requests 100000] [--tenants 100] [--every 5000]
        [--concurrency 16] [--reranker local|off] [--cache-max-mib N]

Starts the fake OpenAI-compatible upstream and one `querygate serve` process (the worker code
path; the suite's config: embedded index, the small and large tiers on the fake upstream, the
in-process response cache at its defaults, escalation on; the local reranker on, as shipped),
with `--tenants` tenants beside the suite's two, each with its own rate limit, daily budget and
index (the suite's acme documents), so per-tenant state exists for every one of them. Then
sends `--requests` queries, each a question no earlier request asked (three styles in turn: a
question on the tenant's documents, one they do not answer, a translation; words drawn by a
seeded generator, so every run sends the same questions) from the tenants in turn, and prints
the process's RSS and PSS (/proc/PID/smaps_rollup) before the first request and after every
`--every` requests, with the statuses seen and the response cache's lookups by result.

Bounded means the curve flattens: the response cache stops growing at
`cache.memory_max_bytes` (256 MiB of entries by default, every tenant's together; the
per-tenant `cache.max_entries`, 10,000, is never reached by 100 tenants here), and nothing
else may grow with the number of distinct questions or requests.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.proxy_compare import fake_upstream  # noqa: E402
from bench.worker_memory import memory_kib  # noqa: E402
from gateway.server import commands  # noqa: E402
from gateway.settings import hash_api_key, load_settings  # noqa: E402
from tests.fixtures.gateway import (  # noqa: E402
    DATA,
    KEYS,
    GatewayProcess,
    gateway_config,
    start_gateway,
    stop_gateway,
)
from tests.metrics import Scrape  # noqa: E402

SEED = 20261203
NOUNS = (
    "router warranty bridge tower river engine harbour library festival glacier orchard "
    "satellite violin cathedral railway lighthouse volcano canal telescope monastery desert "
    "reactor vineyard fortress meadow observatory tunnel stadium island compiler protocol "
    "ledger invoice turbine pipeline archive manuscript theorem vaccine enzyme crystal"
).split()
ADJECTIVES = (
    "ancient modern northern coastal digital medieval alpine urban electric wooden baroque "
    "tropical industrial rural orbital underground maritime nordic gothic solar"
).split()
TEMPLATES = (
    "Does the Acme router warranty cover {a} {n} damage for serial {k}?",
    "What does the {a} {n} near the {m} cover in year {k}?",
    "Translate into French: good morning, {a} {n} number {k}.",
)


def tenant_key(n: int) -> str:
    return f"key-soak-{n:05d}"


def tenants(count: int) -> list[dict[str, object]]:
    """The suite's two tenants and `count` more, each with a generous limit and budget."""
    limits = {"rate_limit": {"requests_per_s": 1000, "burst": 1000}, "daily_budget_usd": 1000}
    suite = [
        {"id": name, "api_key_sha256": hash_api_key(key), **limits} for name, key in KEYS.items()
    ]
    soak = [
        {"id": f"soak-{n:05d}", "api_key_sha256": hash_api_key(tenant_key(n)), **limits}
        for n in range(count)
    ]
    return suite + soak


def questions(count: int) -> list[str]:
    """`count` distinct questions, the same ones every run."""
    rng = random.Random(SEED)
    out = []
    for k in range(count):
        nouns = rng.sample(NOUNS, 2)
        text = TEMPLATES[k % len(TEMPLATES)].format(
            a=rng.choice(ADJECTIVES), n=nouns[0], m=nouns[1], k=k
        )
        out.append(text)
    return out


def by_label(scrape: Scrape, name: str, label: str) -> str:
    """A counter's samples summed by one label, e.g. "exact 3 miss 812 semantic 40"."""
    totals: Counter[str] = Counter()
    for labels, value in scrape.series(name).items():
        totals[dict(labels).get(label, "")] += int(value)
    return " ".join(f"{key} {n}" for key, n in sorted(totals.items()))


async def soak(gw: GatewayProcess, args: argparse.Namespace) -> None:
    texts = questions(args.requests)
    keys = [tenant_key(n) for n in range(args.tenants)]
    statuses: Counter[int] = Counter()
    pid = gw.proc.pid
    started = time.monotonic()

    def line(done: int, text: str) -> None:
        metrics = Scrape.parse(text)
        rss, pss = memory_kib(pid)
        seen = " ".join(f"{s}:{c}" for s, c in sorted(statuses.items()))
        print(
            f"{done:>8}  {time.monotonic() - started:7.0f} s  RSS {rss / 1024:7.1f} MiB  "
            f"PSS {pss / 1024:7.1f} MiB  statuses {seen}  "
            f"routes {by_label(metrics, 'querygate_requests_total', 'route')}  "
            f"cache {by_label(metrics, 'querygate_cache_lookups_total', 'result')}",
            flush=True,
        )

    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def scrape() -> str:
            async with session.get(f"{gw.url}/metrics") as r:
                return await r.text()

        async def one(k: int) -> None:
            headers = {"Authorization": f"Bearer {keys[k % len(keys)]}"}
            body = {"query": texts[k]}
            async with session.post(f"{gw.url}/v1/query", json=body, headers=headers) as r:
                await r.read()
                statuses[r.status] += 1

        print(f"{'requests':>8}  {'elapsed':>9}  memory of the serving process", flush=True)
        line(0, await scrape())
        for start in range(0, args.requests, args.every):
            batch = range(start, min(start + args.every, args.requests))
            queue = iter(batch)
            await asyncio.gather(*(drain(queue, one) for _ in range(args.concurrency)))
            line(batch[-1] + 1, await scrape())


async def drain(queue: Iterator[int], one: Callable[[int], Awaitable[None]]) -> None:
    """One of the client's concurrent senders: the next request of the batch until none."""
    for k in queue:
        await one(k)


def ingest_soak_tenants(workdir: Path, upstream: str, overrides: dict[str, Any]) -> None:
    """Each soak tenant gets the suite's acme documents, in the data dir the gateway will use
    (start_gateway ingests the suite's two tenants itself), so their lookups find evidence."""
    config_path = workdir / "ingest.yaml"
    config = gateway_config(workdir / "data", 0, upstream, overrides=overrides)
    config_path.write_text(yaml.safe_dump(config))
    settings = load_settings(config_path)

    async def ingest_all() -> None:
        for tenant in overrides["tenants"][len(KEYS) :]:
            await commands.ingest(settings, str(tenant["id"]), [DATA / "acme"], sample=False)

    asyncio.run(ingest_all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--every", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--reranker",
        choices=("local", "off"),
        default="local",
        help="retrieval.rerank.reranker: local as shipped (the suite's config turns it off)",
    )
    parser.add_argument(
        "--cache-max-mib",
        type=int,
        default=None,
        help="cache.memory_max_bytes in MiB (default: the shipped 256), to see the plateau sooner",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fake_upstream() as (upstream, _):
        overrides: dict[str, Any] = {"tenants": tenants(args.tenants)}
        if args.cache_max_mib is not None:
            overrides["cache"] = {"memory_max_bytes": args.cache_max_mib * 1024 * 1024}
        ingest_soak_tenants(Path(tmp), upstream, overrides)
        rerank: dict[str, object] = {"rerank": {"reranker": args.reranker}}
        gw = start_gateway(Path(tmp), upstream, retrieval=rerank, overrides=overrides)
        try:
            asyncio.run(soak(gw, args))
        finally:
            stop_gateway(gw)


if __name__ == "__main__":
    main()
