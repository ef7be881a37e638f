"""One tenant floods a real `querygate serve` process; another tenant's queries stay inside
their deadline and are never refused, while the flooder is told 429.

The flooder (acme) runs big document writes back to back (four at a time) and 24 query loops;
the victim (globex) runs two query loops. Loopback only, bounded in time (~12 s of load) and
in count. Asserted: every victim request answered 200 within its deadline, no victim 429, at
least one flooder 429. The measured figures are printed (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pytest

from tests.fixtures.gateway import KEYS, GatewayProcess, start_gateway, stop_gateway

LOAD_S = 12.0
DEADLINE_S = 5.0
DOC_CHARS = 150_000
WORDS = "acme router fan warranty cable shipping invoice refund gizmo widget blue green".split()


@pytest.fixture(scope="module")
def loaded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    overrides = {
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
    workdir = tmp_path_factory.mktemp("admission-load")
    gw = start_gateway(workdir, None, overrides=overrides)
    yield gw
    stop_gateway(gw)


def document(rng: random.Random) -> str:
    sentences = []
    size = 0
    while size < DOC_CHARS:
        s = " ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + f" {rng.random()}."
        sentences.append(s)
        size += len(s) + 1
    return " ".join(sentences)


async def test_a_flooding_tenant_cannot_push_another_past_its_deadline(
    loaded_gateway: GatewayProcess,
) -> None:
    gw = loaded_gateway
    stop_at = time.monotonic() + LOAD_S
    statuses: dict[str, Counter[int]] = {"flood_query": Counter(), "flood_write": Counter()}
    statuses["victim"] = Counter()
    victim_latency: list[float] = []
    rng = random.Random(7)
    timeout = aiohttp.ClientTimeout(total=60)

    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def flood_writes(i: int) -> None:
            n = 0
            while time.monotonic() < stop_at:
                body = {"title": f"big {i}", "text": document(rng)}
                headers = {"Authorization": f"Bearer {KEYS['acme']}"}
                url = f"{gw.url}/v1/documents/big-{i}-{n}"
                async with session.put(url, json=body, headers=headers) as resp:
                    await resp.read()
                    statuses["flood_write"][resp.status] += 1
                    if resp.status == 429:
                        await asyncio.sleep(0.2)
                n += 1

        async def ask(tenant: str, kind: str, i: int) -> None:
            headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
            n = 0
            while time.monotonic() < stop_at:
                # globex may not force a route: both tenants ask with "auto".
                body = {"query": f"How long is the warranty, case {i}-{n}?"}
                started = time.monotonic()
                async with session.post(f"{gw.url}/v1/query", json=body, headers=headers) as r:
                    await r.read()
                    statuses[kind][r.status] += 1
                if kind == "victim":
                    victim_latency.append(time.monotonic() - started)
                    await asyncio.sleep(0.05)
                elif r.status == 429:
                    # A flood of refused requests at loopback speed is the load balancer's
                    # to cut (connection rate limits); here the flooder backs off a little.
                    await asyncio.sleep(0.05)
                n += 1

        await asyncio.gather(
            *(flood_writes(i) for i in range(4)),
            *(ask("acme", "flood_query", i) for i in range(24)),
            *(ask("globex", "victim", i) for i in range(2)),
        )

    latencies = sorted(victim_latency)
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(
        f"\nvictim: {dict(statuses['victim'])} p50 {p50 * 1000:.0f} ms p99 {p99 * 1000:.0f} ms "
        f"max {latencies[-1] * 1000:.0f} ms (deadline {DEADLINE_S:g} s)\n"
        f"flooder queries: {dict(statuses['flood_query'])}\n"
        f"flooder writes: {dict(statuses['flood_write'])}"
    )
    assert latencies, "the victim sent nothing"
    assert set(statuses["victim"]) == {200}, statuses["victim"]
    assert latencies[-1] < DEADLINE_S
    assert statuses["flood_query"][429] + statuses["flood_write"][429] > 0
