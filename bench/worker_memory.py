"""Memory per worker of `querygate serve --workers N`, idle and after traffic, in one run.

    python bench/worker_memory.py [--workers 2] [--requests 400]

Starts a real gateway (the suite's two-tenant config: embedded index, no model upstream, so
answers are extractive) with N workers, reads each process's resident and proportional set
size (RSS, PSS from /proc/PID/smaps_rollup: PSS splits shared pages fairly, so the PSS sum is
what the pod really uses) once all workers are ready and again after `--requests` lookups
spread over them, and prints one line per process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway  # noqa: E402


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return fields["Rss"], fields["Pss"]


def workers_of(gw: GatewayProcess) -> list[int]:
    pid = gw.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def wait_for_workers(gw: GatewayProcess, count: int) -> None:
    deadline = time.monotonic() + 120
    while gw.log().count('"msg": "ready"') < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"workers not ready:\n{gw.log()[-2000:]}")
        time.sleep(0.2)


def report(label: str, gw: GatewayProcess) -> None:
    pids = [("supervisor", gw.proc.pid)] + [("worker", p) for p in workers_of(gw)]
    total_pss = 0
    for kind, pid in pids:
        rss, pss = memory_kib(pid)
        total_pss += pss
        mib = f"RSS {rss / 1024:7.1f} MiB  PSS {pss / 1024:7.1f} MiB"
        print(f"{label:>14}  {kind:<10} pid {pid:>7}  {mib}")
    print(f"{label:>14}  all processes' PSS: {total_pss / 1024:.1f} MiB")


def traffic(gw: GatewayProcess, count: int) -> None:
    def one(n: int) -> int:
        body = {"query": f"What does the warranty cover for part {n}?", "route": "lookup"}
        r = requests.post(f"{gw.url}/v1/query", json=body, headers=gw.headers(), timeout=60)
        return r.status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(one, range(count)))
    bad = [s for s in statuses if s != 200]
    if bad:
        raise SystemExit(f"{len(bad)} requests failed: {sorted(set(bad))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gw = start_gateway(Path(tmp), None, serve_args=("--workers", str(args.workers)))
        try:
            wait_for_workers(gw, args.workers)
            report("idle", gw)
            traffic(gw, args.requests)
            report(f"after {args.requests}", gw)
        finally:
            stop_gateway(gw)


if __name__ == "__main__":
    main()
