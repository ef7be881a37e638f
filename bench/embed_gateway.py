"""The embedding settings' gain through the whole gateway: querygate on numpy vs onnxruntime, or
onnx with one vs two threads per forward pass.

    .venv/bin/python bench/embed_gateway.py [--requests 200] [--concurrency 1 32] [--rounds 2]
    .venv/bin/python bench/embed_gateway.py --variants onnx,onnx-2t

`querygate serve` processes (one worker, cache off), identical but for their `embeddings`
settings, against one fake upstream, driven by `bench/proxy_compare.py`'s closed-loop
client and its CPU accounting (utime + stime of the gateway's process tree from /proc), in
alternating order, cell by cell. Paths (non-streaming `/v1/chat/completions`):

  auto_direct   `model: auto`, a greeting: query embedding + classification, then the model
  lookup        `model: lookup`: query embedding + hybrid retrieval + the model

Reported: requests/s, added p50 over the raw upstream, gateway CPU ms per request, and the
first variant's CPU per request over each other's. The machine's cores are shared by client,
gateways and upstream; CPU per request is the figure a busy machine disturbs least.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from proxy_compare import PATHS, Cell, System, fake_upstream, merge, run_cell  # noqa: E402

from tests.fixtures.gateway import KEYS, start_gateway, stop_gateway  # noqa: E402

# Embedding settings compared (`--variants`, the first is the baseline of the ratio column).
VARIANTS: dict[str, dict[str, object]] = {
    "numpy": {"runtime": "numpy"},
    "onnx": {"runtime": "onnx"},
    "onnx-2t": {"runtime": "onnx", "threads": 2},
}
WANTED = ("auto_direct", "lookup")


async def measure(
    systems: list[System], upstream: System, levels: list[int], requests: int, rounds: int
) -> dict[tuple[str, int, str], Cell]:
    results: dict[tuple[str, int, str], Cell] = defaultdict(Cell)
    paths = [p for p in PATHS if p.name in WANTED]
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for system in systems:  # warm up
            for path in paths:
                await run_cell(session, system, path, False, 4, 24)
        turn = 0
        for c in levels:
            n = max(requests, 4 * c)
            for path in paths:
                for _ in range(rounds):
                    turn += 1
                    order = [upstream, *(systems if turn % 2 else systems[::-1])]
                    for system in order:
                        cell = await run_cell(session, system, path, False, c, n)
                        merge(results[(path.name, c, system.name)], cell)
                row = [results[(path.name, c, s.name)] for s in systems]
                print(
                    f"  c={c:<3} {path.name:<12} "
                    + "; ".join(
                        f"{s.name} {r.rps:.0f}/s {r.cpu_ms:.2f} ms CPU"
                        for s, r in zip(systems, row, strict=True)
                    ),
                    flush=True,
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="numpy,onnx", help=f"of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    variants = args.variants.split(",")
    load0 = os.getloadavg()[0]
    pool = {"max_inflight": 256, "max_queued": 256}
    pool |= {"tenant_max_inflight": 256, "tenant_max_queued": 256}
    with (
        tempfile.TemporaryDirectory(prefix="embed-gateway-") as tmp,
        fake_upstream() as (
            base,
            upstream_pid,
        ),
    ):
        gateways = []
        try:
            for runtime in variants:
                overrides = {
                    "cache": {"backend": "off"},
                    "embeddings": VARIANTS[runtime],
                    "server": {"admission": {"queries": pool}},
                }
                gw = start_gateway(Path(tmp) / runtime, base, overrides=overrides)
                gateways.append((runtime, gw))
            systems = [
                System(
                    f"querygate-{runtime}",
                    f"{gw.url}/v1",
                    [gw.proc.pid],
                    "querygate",
                    {"Authorization": f"Bearer {KEYS['acme']}"},
                )
                for runtime, gw in gateways
            ]
            upstream = System("upstream", base, [upstream_pid], "upstream")
            results = asyncio.run(
                measure(systems, upstream, args.concurrency, args.requests, args.rounds)
            )
        finally:
            for _, gw in gateways:
                stop_gateway(gw)
    load1 = os.getloadavg()[0]
    print(f"\nload average {load0:.1f} / {load1:.1f} on {os.cpu_count()} cores")
    print(
        f"| path | c | embedding | req/s | added p50 ms | CPU ms/req | {variants[0]} CPU ÷ its |\n"
        "|---|---|---|---|---|---|---|"
    )
    for path in WANTED:
        for c in args.concurrency:
            base_p50 = results[(path, c, "upstream")].pct(0.5)
            baseline = results[(path, c, f"querygate-{variants[0]}")]
            for runtime in variants:
                cell = results[(path, c, f"querygate-{runtime}")]
                ratio = f"{baseline.cpu_ms / cell.cpu_ms:.2f}x" if runtime != variants[0] else ""
                print(
                    f"| {path} | {c} | {runtime} | {cell.rps:.0f} | "
                    f"{cell.pct(0.5) - base_p50:+.2f} | {cell.cpu_ms:.2f} | {ratio} |"
                )


if __name__ == "__main__":
    main()
