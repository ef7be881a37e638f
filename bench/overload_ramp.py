"""Overload: an open-loop ramp to 3x saturation against a real `querygate serve`, one run.

    flock /tmp/qg-heavy.lock .venv/bin/python bench/overload_ramp.py
    # a waiting room deeper than max_queue_wait_s drains, so that bound is the one met:
    flock /tmp/qg-heavy.lock .venv/bin/python bench/overload_ramp.py \
        --max-queued 128 --max-queue-wait-s 1 --step-s 8

Processes: the fake upstream (tests/fake_upstream), which holds every chat request for
`--delay-ms` (a `delay_ms` directive in the message), and one `querygate serve` worker, cache
off, four tenants. Every request is a non-streamed `model: direct` chat completion (forced
pass-through: the gateway's whole request path, auth, admission, the upstream call), tenants
in turn. A tenant's shares are half the queries pool's, so with four tenants sending alike the
process's bounds are the ones exercised: 503 `overloaded` when the waiting room is full or a
waiter has waited `max_queue_wait_s`; 429 when a waiter is pushed out for a tenant with a
shorter queue (`gateway.limits.admission`).

1. Saturation: closed loop (each client sends its next request when the last is answered) at
   rising concurrency until the accepted rate stops growing; S is the best rate seen. With a
   held upstream S is `max_inflight / delay`, so the gateway's CPU is not the limit.
2. Ramp: open loop, requests sent on a fixed schedule whatever the replies (a closed loop
   slows down with the server and so cannot overload it), at 0.5x, 1x, 1.5x, 2x and 3x S.
   Latency runs from each request's scheduled send time, so a late client cannot hide queueing.

Per step: offered and accepted (200) rates, accepted latency p50/p99/max, refusals by status
and error type with their share carrying Retry-After and their time to answer, the peak of the
admission gauges from /metrics, the gateway's and the client's CPU (100% = one core) and how
late the client sent. Any other outcome (another status or error type than admission's, a
refusal without Retry-After, a connection error, a client timeout, in the warm-up too) is a
failure: it is printed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
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

from bench.proxy_compare import cpu_seconds, fake_upstream  # noqa: E402
from gateway.settings import hash_api_key  # noqa: E402
from tests.fixtures.gateway import KEYS, GatewayProcess, start_gateway, stop_gateway  # noqa: E402

TENANT_KEYS = {**KEYS, "initech": "key-initech-0004", "umbrella": "key-umbrella-0005"}
DEADLINE_S = 10.0
CLIENT_TIMEOUT_S = DEADLINE_S + 5  # past the gateway's own deadline: a timeout is its fault
RAMP = (0.5, 1.0, 1.5, 2.0, 3.0)
# What admission answers when it sheds (gateway.limits.admission): any other 429 or 503
# is a failure.
REFUSALS = frozenset({"429 rate_limited", "503 overloaded", "503 deadline_exceeded"})
GAUGE_RE = re.compile(r'^querygate_admission_(inflight|queued)\{pool="queries"\} (\S+)$', re.M)


def pool(max_inflight: int, max_queued: int) -> dict[str, int]:
    """The queries pool; each tenant's shares are half the pool's."""
    return {
        "max_inflight": max_inflight,
        "max_queued": max_queued,
        "tenant_max_inflight": max(1, max_inflight // 2),
        "tenant_max_queued": max_queued // 2,
    }


def overrides(queries: dict[str, int], max_queue_wait_s: float) -> dict[str, Any]:
    tenants = [{"id": t, "api_key_sha256": hash_api_key(k)} for t, k in TENANT_KEYS.items()]
    admission = {"queries": queries, "max_queue_wait_s": max_queue_wait_s}
    server = {"request_timeout_s": DEADLINE_S, "admission": admission}
    return {"tenants": tenants, "server": server, "cache": {"backend": "off"}}


def bodies(delay_ms: int) -> list[tuple[bytes, dict[str, str]]]:
    """One request per tenant: body and headers, encoded once."""
    directive = json.dumps({"delay_ms": delay_ms})
    content = f"Write one short sentence about routers. [[fake:{directive}]]"
    body = json.dumps({"model": "direct", "messages": [{"role": "user", "content": content}]})
    return [
        (body.encode(), {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        for key in TENANT_KEYS.values()
    ]


def pct(values: list[float], q: float) -> float:
    """The q-quantile in ms (nearest rank); NaN when there is nothing to rank."""
    if not values:
        return float("nan")
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)] * 1000


@dataclass
class Step:
    offered_rate: float
    seconds: float  # of sending
    wall_s: float = 0.0  # to the last answer: the rates count the drain of the queue too
    sent: int = 0
    accepted_s: list[float] = field(default_factory=list)
    refused_s: dict[str, list[float]] = field(default_factory=dict)  # "503 overloaded": times
    retry_after: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    lag_s: list[float] = field(default_factory=list)  # actual send time - scheduled
    peak_inflight: float = 0.0
    peak_queued: float = 0.0
    gateway_cpu_s: float = 0.0  # utime + stime of the gateway process while the step ran
    client_cpu_s: float = 0.0  # and of this process

    @property
    def accepted_rate(self) -> float:
        return len(self.accepted_s) / self.wall_s

    def row(self, saturation: float) -> str:
        rejects = [t for times in self.refused_s.values() for t in times]
        acc = self.accepted_s
        cells = [
            f"{self.offered_rate / saturation:.1f}x",
            f"{self.sent / self.seconds:.0f}",
            f"{self.accepted_rate:.0f}",
            f"{pct(acc, 0.5):.0f}",
            f"{pct(acc, 0.99):.0f}",
            f"{pct(acc, 1.0):.0f}",
            "; ".join(
                f"{len(t)} {k} (p50 {pct(t, 0.5):.1f}, p99 {pct(t, 0.99):.1f})"
                for k, t in sorted(self.refused_s.items())
            )
            or "-",
            f"{100 * self.retry_after / len(rejects):.0f}%" if rejects else "-",
            f"{pct(rejects, 0.5):.1f}" if rejects else "-",
            f"{pct(rejects, 0.99):.1f}" if rejects else "-",
            f"{self.peak_inflight:.0f} / {self.peak_queued:.0f}",
            f"{100 * self.gateway_cpu_s / self.wall_s:.0f}% / "
            f"{100 * self.client_cpu_s / self.wall_s:.0f}%",
            f"{pct(self.lag_s, 0.99):.1f}",
            ", ".join(f"{n} {k}" for k, n in sorted(self.failures.items())) or "0",
        ]
        return "| " + " | ".join(cells) + " |"


HEADER = (
    "| load | offered/s | accepted/s | accepted p50 ms | p99 ms | max ms | refused (ms to answer) "
    "| with Retry-After | reject p50 ms | reject p99 ms | peak in-flight / queued "
    "| CPU gateway / client | client lag p99 ms | failures |\n" + "|---" * 14 + "|"
)


async def send(
    session: aiohttp.ClientSession, url: str, request: tuple[bytes, dict[str, str]]
) -> tuple[int, str, bool]:
    """Status, error type (refusals) and whether Retry-After came; the whole body read."""
    body, headers = request
    async with session.post(url, data=body, headers=headers) as resp:
        raw = await resp.read()
        if resp.status == 200:
            return 200, "", False
        try:
            kind = str(json.loads(raw)["error"]["type"])
        except (ValueError, KeyError, TypeError):
            kind = "unparsed"
        return resp.status, kind, "Retry-After" in resp.headers


async def one(
    session: aiohttp.ClientSession,
    url: str,
    request: tuple[bytes, dict[str, str]],
    step: Step,
    scheduled: float,
) -> bool:
    """Send one request and file its outcome in `step`; True when accepted."""
    try:
        status, kind, retry_after = await send(session, url, request)
    except TimeoutError:
        step.failures["client timeout"] += 1
        return False
    except aiohttp.ClientError as exc:
        step.failures[type(exc).__name__] += 1
        return False
    elapsed = time.perf_counter() - scheduled
    if status == 200:
        step.accepted_s.append(elapsed)
        return True
    if f"{status} {kind}" not in REFUSALS:
        step.failures[f"{status} {kind}"] += 1
        return False
    step.refused_s.setdefault(f"{status} {kind}", []).append(elapsed)
    step.retry_after += retry_after
    if not retry_after:  # a refusal the client cannot pace itself by
        step.failures[f"{status} {kind} without Retry-After"] += 1
    return False


async def closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    requests: list[tuple[bytes, dict[str, str]]],
    concurrency: int,
    seconds: float,
) -> Step:
    step = Step(0.0, seconds)
    start = time.perf_counter()
    stop_at = start + seconds

    async def client(i: int) -> None:
        request = requests[i % len(requests)]
        while time.perf_counter() < stop_at:
            step.sent += 1
            if not await one(session, url, request, step, time.perf_counter()):
                await asyncio.sleep(0.05)  # a refused client backs off a little

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    step.wall_s = time.perf_counter() - start
    return step


async def saturation(
    session: aiohttp.ClientSession,
    url: str,
    requests: list[tuple[bytes, dict[str, str]]],
    seconds: float,
) -> tuple[float, list[Step]]:
    """The best accepted rate of a closed loop at rising concurrency (x1.5 until it grows by
    less than 5%)."""
    best, concurrency, steps = 0.0, 2, []
    while True:
        step = await closed_loop(session, url, requests, concurrency, seconds)
        steps.append(step)
        print(f"  closed loop c={concurrency}: {step.accepted_rate:.1f} accepted/s", flush=True)
        if step.accepted_rate < best * 1.05:
            return max(best, step.accepted_rate), steps
        best = step.accepted_rate
        concurrency = int(concurrency * 1.5) + 1


async def watch_gauges(session: aiohttp.ClientSession, metrics_url: str, step: Step) -> None:
    """Keep the peak of the queries pool's admission gauges in `step`, until cancelled."""
    while True:
        async with session.get(metrics_url) as resp:
            text = await resp.text()
        for name, value in GAUGE_RE.findall(text):
            if name == "inflight":
                step.peak_inflight = max(step.peak_inflight, float(value))
            else:
                step.peak_queued = max(step.peak_queued, float(value))
        await asyncio.sleep(0.2)


async def open_loop(
    session: aiohttp.ClientSession,
    gw: GatewayProcess,
    requests: list[tuple[bytes, dict[str, str]]],
    rate: float,
    seconds: float,
) -> Step:
    """`rate` requests/s, evenly spaced, for `seconds`; then wait for the last answers."""
    step = Step(rate, seconds)
    cpu0, client0 = cpu_seconds([gw.proc.pid]), time.process_time()
    url = f"{gw.url}/v1/chat/completions"
    gauges = asyncio.create_task(watch_gauges(session, f"{gw.url}/metrics", step))
    pending: set[asyncio.Task[bool]] = set()
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        step.lag_s.append(time.perf_counter() - scheduled)
        step.sent += 1
        task = asyncio.create_task(one(session, url, requests[i % len(requests)], step, scheduled))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    step.wall_s = time.perf_counter() - start
    step.gateway_cpu_s = cpu_seconds([gw.proc.pid]) - cpu0
    step.client_cpu_s = time.process_time() - client0
    gauges.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gauges
    return step


async def run(gw: GatewayProcess, delay_ms: int, step_s: float, probe_s: float) -> bool:
    """Print the saturation search and the ramp's table; True when nothing failed."""
    requests = bodies(delay_ms)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = f"{gw.url}/v1/chat/completions"
        warmup = await closed_loop(session, url, requests, 4, 1.0)
        sat, probes = await saturation(session, url, requests, probe_s)
        print(f"saturation S = {sat:.1f} accepted/s", flush=True)
        steps = []
        for load in RAMP:
            step = await open_loop(session, gw, requests, load * sat, step_s)
            print(f"  {load:.1f}x done: {step.accepted_rate:.0f} accepted/s", flush=True)
            steps.append(step)
    print()
    print(HEADER)
    for step in steps:
        print(step.row(sat))
    failures = sum((s.failures for s in [warmup, *probes, *steps]), Counter[str]())
    if failures:
        print(f"\nFAILED: undesigned outcomes {dict(failures)}")
    return not failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=int, default=200, help="the upstream's hold")
    parser.add_argument("--step-s", type=float, default=12.0, help="seconds per ramp step")
    parser.add_argument("--probe-s", type=float, default=3.0, help="seconds per closed loop")
    parser.add_argument("--max-inflight", type=int, default=16)
    parser.add_argument("--max-queued", type=int, default=32)
    parser.add_argument("--max-queue-wait-s", type=float, default=2.0)
    args = parser.parse_args()
    queries = pool(args.max_inflight, args.max_queued)
    print(f"command: python bench/overload_ramp.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"queries pool {queries}, max_queue_wait_s {args.max_queue_wait_s:g}, "
        f"deadline {DEADLINE_S:g} s, "
        f"upstream hold {args.delay_ms} ms, {len(TENANT_KEYS)} tenants",
        flush=True,
    )
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="overload-") as tmp, fake_upstream() as (up, _):
        gw = start_gateway(Path(tmp), up, overrides=overrides(queries, args.max_queue_wait_s))
        try:
            ok = asyncio.run(run(gw, args.delay_ms, args.step_s, args.probe_s))
        finally:
            stop_gateway(gw)
    print(
        f"machine: {os.cpu_count()} cores, load avg {load0:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
