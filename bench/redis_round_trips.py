"""Which Redis commands each kind of request sends, in order, and what they cost its latency.

    python bench/redis_round_trips.py [--delay-ms 100] [--repeat 3]

The gateway app (`create_app`, in process) with the cache and the quotas on a throwaway
redis-server (`tests.redis_server`), the fake upstream as the model (its own process), and
`tests.tcp_proxy` in front of Redis delaying each piece of data `--delay-ms` each way, so one
sequential round trip costs about 2 x delay. Per request kind it prints:

- the commands the server received (read from MONITOR on a direct connection, the scripts
  named by their SHA), those before the response arrived (`critical`) then those after it;
- the request's latency without the delay and through the delaying proxy, and from the
  difference the round trips that were sequential on its path ((delayed - direct) / 2 delay).

Request kinds: a cache miss (exact get and single-flight claim in one script, semantic lookup,
model call, store, release), an exact hit (the same question again), a semantic hit (a
paraphrase), the same miss for a tenant with a rate limit and a daily budget, and that tenant's
streamed miss. The health probe's PINGs are left out. Loopback only, bounded: 5 kinds x
`--repeat` requests per setting.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from backends.cache import redis_scripts as cache_scripts  # noqa: E402
from backends.quotas import redis as quota_redis  # noqa: E402
from bench.gateway_overhead import fake_upstream  # noqa: E402
from gateway.server.app import create_app  # noqa: E402
from gateway.settings import Settings, hash_api_key  # noqa: E402
from tests.redis_server import free_port, running_redis  # noqa: E402


def script_names() -> dict[str, str]:
    """SHA1 of every Lua script the stores register -> a readable name."""
    names: dict[str, str] = {}
    for module in (cache_scripts, quota_redis):
        for attr, value in vars(module).items():
            if isinstance(value, str) and "redis.call" in value:
                names[hashlib.sha1(value.encode()).hexdigest()] = attr.strip("_").lower()
    return names


class Monitor:
    """MONITOR on a direct connection: every command the server runs, with its time."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffered = b""
        while chunk := self._sock.recv(65536):
            buffered += chunk
            *complete, buffered = buffered.split(b"\r\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                if not line.startswith("+") or line == "+OK":
                    continue
                stamp, _, rest = line[1:].partition(" ")
                with self._lock:
                    self.lines.append((float(stamp), rest))

    def since(self, mark: int) -> list[tuple[float, str]]:
        with self._lock:
            return self.lines[mark:]

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)


def describe(rest: str, names: dict[str, str]) -> str | None:
    """`[0 127.0.0.1:5555] "EVALSHA" "sha" ...` -> `EVALSHA get`; None for what is not a
    request's (commands run inside a script, health PINGs, our own MONITOR)."""
    where, _, command = rest.partition("] ")
    if "lua" in where:
        return None
    parts = [p.strip('"') for p in command.split('" "')]
    verb = parts[0].upper()
    if verb in ("PING", "MONITOR", "INFO", "CLUSTER", "MODULE", "VSIM", "COMMAND", "HELLO"):
        return None
    if verb in ("EVALSHA", "EVAL") and len(parts) > 1:
        return f"{verb.lower()}:{names.get(parts[1], parts[1][:8])}"
    return verb.lower()


@contextmanager
def process(args: list[str], ready: bytes) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and ready not in proc.stdout.readline():
            pass
        yield proc
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Sample:
    latency_ms: list[float] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    cache: str = ""


KINDS = ("miss", "exact hit", "semantic hit", "limited miss", "limited stream")


async def run_kinds(
    redis_url: str,
    upstream: str,
    monitor: Monitor,
    repeat: int,
    names: dict[str, str],
    budget_s: float,
) -> dict[str, Sample]:
    data_dir = Path(tempfile.mkdtemp(prefix="qg-rt-"))
    tier = {"api_base": upstream, "retries": 0, "input_cost_per_token": 1e-7}
    settings = Settings.model_validate(
        {
            "data_dir": data_dir,
            "server": {"reload_poll_s": 0},
            "tenants": [
                {"id": "plain", "api_key_sha256": hash_api_key("key-plain")},
                {
                    "id": "limited",
                    "api_key_sha256": hash_api_key("key-limited"),
                    "rate_limit": {"requests_per_s": 1000, "burst": 1000},
                    "daily_budget_usd": 1000.0,
                },
            ],
            "models": {"small": {"model": "openai/fake-small", **tier}},
            "cache": {
                "backend": "redis",
                "redis_url": redis_url,
                "redis_request_budget_s": budget_s,
            },
            "router": {"classifier": "heuristic"},
        }
    )
    out = {kind: Sample() for kind in KINDS}
    async with TestClient(TestServer(create_app(settings))) as client:

        async def one(kind: str, tenant: str, query: str, stream: bool = False) -> None:
            mark = monitor.mark()
            body = {"query": query, "route": "direct", "stream": stream}
            started = time.perf_counter()
            async with client.post(
                "/v1/query", json=body, headers={"Authorization": f"Bearer key-{tenant}"}
            ) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw[:300]
            answered = time.time()
            elapsed = (time.perf_counter() - started) * 1000
            await asyncio.sleep(0.6)  # writes sent after the answer
            sample = out[kind]
            sample.latency_ms.append(elapsed)
            text = raw.decode(errors="replace")
            sample.cache = text.split('"cache": "', 1)[-1].split('"', 1)[0][:8]
            critical: list[str] = []
            after: list[str] = []
            for stamp, rest in monitor.since(mark):
                if (name := describe(rest, names)) is not None:
                    (critical if stamp <= answered else after).append(name)
            sample.critical, sample.after = critical, after

        for _ in range(repeat):
            topic = uuid.uuid4().hex[:8]
            question = f"Please tell me a short friendly greeting for the team called {topic}"
            await one("miss", "plain", question)
            await one("exact hit", "plain", question)
            await one("semantic hit", "plain", question + " please")
            await one("limited miss", "limited", question)
            await one("limited stream", "limited", f"Now greet the group named {topic}", True)
    return out


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay-ms", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=0.25, help="redis_request_budget_s")
    args = parser.parse_args()
    names = script_names()
    # (delay, request budget): no delay; delayed with the budget out of the way (what the
    # round trips cost); delayed with the configured budget (what a request pays).
    settings = [(0, 60.0), (args.delay_ms, 60.0), (args.delay_ms, args.budget_s)]
    results: dict[tuple[int, float], dict[str, Sample]] = {}
    with running_redis() as server, fake_upstream() as upstream:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        monitor = Monitor(port)
        for delay, budget_s in settings:
            proxy_port = free_port()
            mode = ["--mode", "slow", "--delay-ms", str(delay)] if delay else []
            with process(
                [sys.executable, "-m", "tests.tcp_proxy", "--port", str(proxy_port),
                 "--target", f"127.0.0.1:{port}", *mode],
                b"tcp-proxy ready",
            ):  # fmt: skip
                url = f"redis://127.0.0.1:{proxy_port}/0"
                results[(delay, budget_s)] = asyncio.run(
                    run_kinds(url, upstream, monitor, args.repeat, names, budget_s)
                )
    direct, slow, budgeted = (results[k] for k in settings)
    print(f"Redis through tcp_proxy, +{args.delay_ms} ms each way; median of {args.repeat}")
    print(
        f"{'kind':<16}{'direct ms':>10}{'delayed ms':>11}{'seq trips':>10}"
        f"{f'budget {args.budget_s:g}s ms':>18}  cache (direct / budgeted)"
    )
    for kind in KINDS:
        d, s, b = (median(r[kind].latency_ms) for r in (direct, slow, budgeted))
        trips = (s - d) / (2 * args.delay_ms)
        cache = f"{direct[kind].cache} / {budgeted[kind].cache}"
        print(f"{kind:<16}{d:>10.1f}{s:>11.1f}{trips:>10.1f}{b:>18.1f}  {cache}")
    print("\ncommands (last request of each kind, no delay): before the answer | after it")
    for kind in KINDS:
        sample = direct[kind]
        print(f"  {kind:<15} {len(sample.critical)}: {' '.join(sample.critical)}")
        print(f"  {'':<15} after: {' '.join(sample.after) or '-'}")


if __name__ == "__main__":
    main()
