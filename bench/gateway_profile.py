"""Where one querygate worker spends its CPU on one path under load: py-spy samples it.

    .venv/bin/python bench/gateway_profile.py passthrough            # c=32, 20 s, not streamed
    .venv/bin/python bench/gateway_profile.py auto_direct --stream --seconds 30

Starts the fake upstream and `querygate serve` (one worker; cache off, or on for the *_hit
paths), drives the path with bench/proxy_compare.py's client at `--concurrency`, and samples
the worker with py-spy (installed into bench/.venv-litellm on first use, like the LiteLLM
proxy: not a project dependency). Prints the CPU per request measured from /proc over the
sampled window, then the frames holding the largest share of samples, inclusive and self
(idle threads are not sampled). docs/benchmarks.md quotes these profiles.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.proxy_compare import (  # noqa: E402
    LITELLM_VENV,
    PATHS,
    Cell,
    System,
    ensure_litellm,
    fake_upstream,
    merge,
    run_cell,
)
from tests.fixtures.gateway import KEYS, start_gateway, stop_gateway  # noqa: E402


def ensure_py_spy() -> Path:
    py_spy = LITELLM_VENV / "bin" / "py-spy"
    if not py_spy.exists():
        ensure_litellm()  # the bench environment
        pip = [str(LITELLM_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "py-spy>=0.3,<1"], check=True)
    return py_spy


def frame_name(frame: str) -> str:
    """`function (file.py)` from py-spy's raw `function (path/file.py:line)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else name


def summary(raw: Path, top: int) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [frame_name(f) for f in stack.split(";")]
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    if not total:
        return "no samples"
    skip = ("runpy", "__main__", "cli.py", "web.py", "base_events.py", "(events.py", "thread")
    lines = [f"{total} samples", "inclusive:"]
    lines += [
        f"  {100 * n / total:5.1f}%  {name}"
        for name, n in inclusive.most_common(top * 3)
        if not any(s in name for s in skip)
    ][:top]
    lines.append("self:")
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top // 2)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", choices=[p.name for p in PATHS])
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    path = next(p for p in PATHS if p.name == args.path)
    py_spy = ensure_py_spy()
    pool = {"max_inflight": 256, "max_queued": 256}
    pool |= {"tenant_max_inflight": 256, "tenant_max_queued": 256}
    overrides = {
        "cache": {"backend": "memory" if path.cache else "off"},
        "server": {"admission": {"queries": pool}},
    }
    with fake_upstream() as (upstream, _), tempfile.TemporaryDirectory() as tmp:
        gw = start_gateway(Path(tmp) / "gateway", upstream, overrides=overrides)
        headers = {"Authorization": f"Bearer {KEYS['acme']}"}
        system = System("querygate", f"{gw.url}/v1", [gw.proc.pid], "querygate", headers)
        raw = Path(tmp) / "profile.txt"

        async def drive() -> Cell:
            total = Cell()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                if path.cache:  # the answer a hit serves, and the one a paraphrase finds
                    from bench.proxy_compare import SEMANTIC_PRIME, Path_

                    prime = Path_("prime", "auto", SEMANTIC_PRIME, cache=True)
                    await run_cell(s, system, prime, False, 1, 1)
                await run_cell(s, system, path, args.stream, 4, 50)  # warm
                spy = await asyncio.create_subprocess_exec(
                    *(str(py_spy), "record", "-p", str(gw.proc.pid), "-d", str(args.seconds)),
                    *("-r", "200", "-f", "raw", "-o", str(raw), "--nonblocking"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                while spy.returncode is None:
                    cell = await run_cell(s, system, path, args.stream, args.concurrency, 200)
                    merge(total, cell)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(spy.wait(), 0.001)
            return total

        try:
            total = asyncio.run(drive())
        finally:
            stop_gateway(gw)
        print(
            f"{path.name} stream={args.stream} c={args.concurrency}: {total.n} requests, "
            f"{total.rps:.0f} req/s, gateway CPU {total.cpu_ms:.2f} ms/req, "
            f"{total.errors} errors"
        )
        print(summary(raw, args.top))


if __name__ == "__main__":
    main()
