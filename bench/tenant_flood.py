"""One tenant floods a real `querygate serve`; what another tenant's queries see, in one run.

    python bench/tenant_flood.py [--seconds 12]

The flooder (acme) runs four loops of 150 KB document writes and 24 query loops; the victim
(globex) runs two query loops. Two scenarios on the same gateway, one after the other:
`backoff`, where the flooder waits 50 ms after each 429 (as a client honouring Retry-After
roughly does), and `no-backoff`, where it retries at once (loopback speed: only a
connection-rate limit in front of the gateway stops that). Printed per scenario: the victim's
statuses and latency p50/p99/max against its deadline, and the flooder's statuses.
Loopback only, bounded in time. `tests/e2e/test_admission_load.py` asserts the behaviour of the
`backoff` scenario with the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.fixtures.gateway import KEYS, GatewayProcess, start_gateway, stop_gateway  # noqa: E402

DEADLINE_S = 5.0
DOC_CHARS = 150_000
WORDS = "acme router fan warranty cable shipping invoice refund gizmo widget blue green".split()
# A small query pool, so a 2-core machine saturates it: the shares are what is measured.
OVERRIDES: dict[str, Any] = {
    "server": {
        "max_body_bytes": 1_048_576,
        "request_timeout_s": DEADLINE_S,
        "write_timeout_s": 20,
        "shutdown_grace_s": 5,
        "admission": {
            "queries": {
                "max_inflight": 8,
                "max_queued": 16,
                "tenant_max_inflight": 4,
                "tenant_max_queued": 4,
            },
        },
    },
    "cache": {"backend": "off"},  # every query does the full work
}


@dataclass
class FloodResult:
    victim: Counter[int] = field(default_factory=Counter)
    flood_query: Counter[int] = field(default_factory=Counter)
    flood_write: Counter[int] = field(default_factory=Counter)
    victim_latency_s: list[float] = field(default_factory=list)
    # The gateway's own time for each victim answer (`timings_ms.total`): what its deadline
    # judges, without this client's event loop, busy with the flood, in it.
    victim_served_s: list[float] = field(default_factory=list)

    def summary(self) -> str:
        lat = sorted(self.victim_latency_s)
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        return (
            f"victim {dict(self.victim)} p50 {p50 * 1000:.0f} ms p99 {p99 * 1000:.0f} ms "
            f"max {lat[-1] * 1000:.0f} ms, served in at most "
            f"{max(self.victim_served_s, default=0) * 1000:.0f} ms (deadline {DEADLINE_S:g} s); "
            f"flooder queries {dict(self.flood_query)}, writes {dict(self.flood_write)}"
        )


def document(rng: random.Random) -> str:
    sentences = []
    size = 0
    while size < DOC_CHARS:
        s = " ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + f" {rng.random()}."
        sentences.append(s)
        size += len(s) + 1
    return " ".join(sentences)


async def flood(gw: GatewayProcess, seconds: float, backoff_s: float) -> FloodResult:
    """Run the load for `seconds`; the flooder waits `backoff_s` after each query 429."""
    result = FloodResult()
    stop_at = time.monotonic() + seconds
    rng = random.Random(7)
    timeout = aiohttp.ClientTimeout(total=60)

    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def writes(i: int) -> None:
            headers = {"Authorization": f"Bearer {KEYS['acme']}"}
            n = 0
            while time.monotonic() < stop_at:
                body = {"title": f"big {i}", "text": document(rng)}
                url = f"{gw.url}/v1/documents/big-{i}-{n}"
                async with session.put(url, json=body, headers=headers) as resp:
                    await resp.read()
                    result.flood_write[resp.status] += 1
                if resp.status == 429:
                    await asyncio.sleep(0.2)
                n += 1

        async def ask(tenant: str, counts: Counter[int], i: int) -> None:
            headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
            victim = counts is result.victim
            n = 0
            while time.monotonic() < stop_at:
                # globex may not force a route: both tenants ask with "auto"
                body = {"query": f"How long is the warranty, case {i}-{n}?"}
                started = time.monotonic()
                async with session.post(f"{gw.url}/v1/query", json=body, headers=headers) as r:
                    answer = await r.read()
                    counts[r.status] += 1
                if victim and r.status == 200:
                    result.victim_served_s.append(json.loads(answer)["timings_ms"]["total"] / 1000)
                if victim:
                    result.victim_latency_s.append(time.monotonic() - started)
                    await asyncio.sleep(0.05)
                elif r.status == 429 and backoff_s:
                    await asyncio.sleep(backoff_s)
                n += 1

        await asyncio.gather(
            *(writes(i) for i in range(4)),
            *(ask("acme", result.flood_query, i) for i in range(24)),
            *(ask("globex", result.victim, i) for i in range(2)),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    args = parser.parse_args()
    print(f"command: python bench/tenant_flood.py --seconds {args.seconds:g}")
    with tempfile.TemporaryDirectory() as tmp:
        gw = start_gateway(Path(tmp), None, overrides=OVERRIDES)
        try:
            for name, backoff_s in (("backoff", 0.05), ("no-backoff", 0.0)):
                result = asyncio.run(flood(gw, args.seconds, backoff_s))
                print(f"{name:>10}: {result.summary()}", flush=True)
        finally:
            stop_gateway(gw)
    print(f"machine: {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
