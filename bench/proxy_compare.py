"""querygate against the LiteLLM proxy, Portkey's gateway and a bare forwarder, one run.

    .venv/bin/python bench/proxy_compare.py                 # the full matrix (~15 min on 2 cores)
    .venv/bin/python bench/proxy_compare.py --scale 0.3     # fewer requests per cell
    .venv/bin/python bench/proxy_compare.py --write-docs    # also rewrite docs/benchmarks.md's
                                                            # figures section
    .venv/bin/python bench/proxy_compare.py --tracing       # querygate alone, tracing off and on
    .venv/bin/python bench/proxy_compare.py --rerank        # querygate alone, reranker off and on

One command from a clean checkout: the LiteLLM proxy (`litellm[proxy]==1.108.7`, the version
docs/benchmarks.md reports; not a project dependency) is installed into `bench/.venv-litellm`
on first use, and Portkey's open-source gateway (`@portkey-ai/gateway`, pinned with its whole
dependency tree by bench/portkey/package-lock.json) into `bench/.portkey` with `npm ci`.
Processes, each its own: the fake OpenAI-compatible upstream (tests/fake_upstream), the LiteLLM
proxy with one worker (once without and once with its in-memory cache), Portkey's gateway (one
Node process; the upstream is its `openai` provider at a custom host, given per request in
`x-portkey-*` headers), the bare forwarder (bench/bare_forwarder.py: the floor of an aiohttp
stack), and `querygate serve` with 1 and with 2 workers (cache off, and cache on: in-process
memory, semantic tier on), all pointing at that upstream.

For each concurrency (1, 32, 128), path and streaming flag, every system gets the same number
of requests from one aiohttp client (closed loop: `c` workers, each sends its next request when
the last answered), the systems one after the other in rotating order, so drift in the machine's
load falls on all of them alike. Paths:

  passthrough   querygate `model: direct` (forced route: no classification, no retrieval);
                LiteLLM, Portkey and the forwarder `model: fake-small`
  auto_direct   querygate `model: auto` with a question the classifier routes direct
  lookup        querygate `model: lookup` (hybrid retrieval over tests/data, sources in the
                prompt)
  exact_hit     cache on: the same question again and again (LiteLLM: its local cache;
                Portkey's open-source build has no response cache, so it runs passthrough only)
  semantic_hit  cache on: a paraphrase of a cached question (querygate only: LiteLLM's semantic
                caches need Redis Stack or Qdrant; its ratio is against LiteLLM's exact hit)

Reported per cell: requests/s, the added latency p50/p99 (the system's minus the raw upstream's
at the same concurrency and streaming flag, measured in the same rotation) and the gateway's CPU
per request (utime + stime of the gateway's whole process tree from /proc, before and after the
cell: every worker, the supervisor, Node's own children). Pass-through is also reported as
ratios to the bare forwarder, first. Everything shares this machine's cores (client, gateways,
upstream, other work), so read the ratios; the load average seen is printed with the table.

`--tracing` weighs querygate's OpenTelemetry tracing instead: only querygate with one worker, cache
off, twice side by side, once with tracing off (the default) and once on, every request sampled
and its spans exported over OTLP/HTTP to bench/otlp_sink.py (a receiver that discards them), on
the paths that do not need the cache; reported as traced ÷ untraced. `--rerank` weighs the
local reranker the same way: the suite's configuration (reranker off) against the same with
`retrieval.rerank.reranker: local` and the shipped policy, which decides per question whether
to pay for the cross-encoder; the rerank stage's decisions are printed after the table.
`--int8` weighs `embeddings.precision: int8` against the default fp32 encoder the same way
(the paths that embed: auto_direct and lookup). `--rerank --rerank-when always` reranks every
lookup instead: what a reranked lookup pays (the
benchmark's lookup question is confident, so the shipped policy skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.gateway import (  # noqa: E402
    KEYS,
    GatewayProcess,
    free_port,
    start_gateway,
    stop_gateway,
)
from tests.fixtures.upstream import _await_ready_line  # noqa: E402

LITELLM_VERSION = "1.108.7"
LITELLM_VENV = REPO / "bench" / ".venv-litellm"
LITELLM_KEY = "sk-bench-" + "5f0c9a7e3b2d4c6a8e1f7b9d0c2e4a6b"
PORTKEY_VERSION = "1.15.2"  # kept equal to bench/portkey/package.json
PORTKEY_MANIFEST = REPO / "bench" / "portkey"  # package.json + package-lock.json, committed
PORTKEY_DIR = REPO / "bench" / ".portkey"  # the install, gitignored
FLOOR = "bare-forwarder"
DOCS = REPO / "docs" / "benchmarks.md"
FIGURES_START = "<!-- proxy_compare figures: start -->"
FIGURES_END = "<!-- proxy_compare figures: end -->"

PASSTHROUGH_Q = "Write one short sentence about routers."
DIRECT_Q = "Hello there, thanks a lot!"
LOOKUP_Q = "How do I fix ERR-4471 on the Acme router?"
EXACT_Q = "What does error ERR-5120 mean on the Acme router?"
SEMANTIC_PRIME = "How can I fix the ERR-4471 error on the Acme router?"
SEMANTIC_Q = "How can I fix the ERR-4471 error on an Acme router?"

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Path_:
    name: str
    model: str  # querygate's `model`
    question: str
    cache: bool  # served by the cache-on systems
    streams: bool = True


PATHS = (
    Path_("passthrough", "direct", PASSTHROUGH_Q, cache=False),
    Path_("auto_direct", "auto", DIRECT_Q, cache=False),
    Path_("lookup", "lookup", LOOKUP_Q, cache=False),
    Path_("exact_hit", "auto", EXACT_Q, cache=True),
    Path_("semantic_hit", "auto", SEMANTIC_Q, cache=True),
)


@dataclass
class System:
    name: str
    url: str  # the base under which /chat/completions is served
    pids: list[int]  # roots of the process trees whose CPU is the gateway's
    kind: str  # upstream | litellm | portkey | forwarder | querygate
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Cell:
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    cpu_s: float = 0.0

    @property
    def n(self) -> int:
        return len(self.latencies_s)

    def pct(self, q: float) -> float:
        lat = sorted(self.latencies_s)
        if not lat:
            return float("nan")
        if q == 0.5:
            return statistics.median(lat) * 1000
        return lat[min(len(lat) - 1, int(len(lat) * q))] * 1000

    @property
    def rps(self) -> float:
        return self.n / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s * 1000 / self.n if self.n else float("nan")


# -- processes ------------------------------------------------------------------------------


def _tree(root: int) -> list[int]:
    """`root` and every descendant, from /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(roots: list[int]) -> float:
    """utime + stime of every process under `roots` (live ones; workers do not exit here)."""
    ticks = 0
    for root in roots:
        for pid in _tree(root):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return ticks / CLK_TCK


@contextmanager
def fake_upstream() -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_upstream", "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield _await_ready_line(proc, time.monotonic() + 30) + "/v1", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def _served(
    command: list[str], health: str, log_path: Path, start_timeout_s: float, **popen: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """`command` running, its output in `log_path`, once `health` answers 200; stopped after."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
        try:
            _wait_http(health, proc, start_timeout_s)
            yield proc
        finally:
            _stop(proc)


def ensure_litellm() -> Path:
    """The proxy's own environment, made on first use: never the project's."""
    litellm = LITELLM_VENV / "bin" / "litellm"
    python = LITELLM_VENV / "bin" / "python"
    if litellm.exists():
        shown = subprocess.run(
            [str(python), "-m", "pip", "show", "litellm"], capture_output=True, text=True
        ).stdout
        if f"Version: {LITELLM_VERSION}" in shown:
            return litellm
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
        check=True,
    )
    return litellm


def litellm_env() -> dict[str, str]:
    # Offline: the bundled price map, no tokenizer download (docs: environment facts).
    return {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
    }


@contextmanager
def litellm_proxy(workdir: Path, upstream: str, cache: bool) -> Iterator[System]:
    litellm = ensure_litellm()
    port = free_port()
    settings: dict[str, Any] = {"drop_params": True, "num_retries": 0, "request_timeout": 60}
    if cache:
        settings.update({"cache": True, "cache_params": {"type": "local"}})
    config = {
        "model_list": [
            {
                "model_name": "fake-small",
                "litellm_params": {
                    "model": "openai/fake-small",
                    "api_base": upstream,
                    "api_key": "fake-key",
                },
            }
        ],
        "litellm_settings": settings,
        # Authenticated like querygate's tenants: one key, no database.
        "general_settings": {"master_key": LITELLM_KEY},
    }
    path = workdir / f"litellm-{'cache' if cache else 'nocache'}.json"
    path.write_text(json.dumps(config))
    command = [str(litellm), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with _served(
        [*command, "--num_workers", "1"],
        f"{url}/health/liveliness",
        workdir / f"{path.stem}.log",
        180,
        cwd=workdir,
        env=litellm_env(),
    ) as proc:
        name = f"litellm{'+cache' if cache else ''}"
        headers = {"Authorization": f"Bearer {LITELLM_KEY}"}
        yield System(name, f"{url}/v1", [proc.pid], "litellm", headers)


def ensure_portkey() -> Path:
    """Portkey's gateway in its own folder, exactly the committed lock's tree: never the project's.

    The lock pins `@hono/node-server` 1.13.5, `@hono/node-ws` 1.2.0 and `hono` 4.9.7 (the
    versions of Portkey's own lock for this release) through `overrides`: with the newer
    `@hono/node-server` npm resolves by default, every streamed answer fails inside the gateway
    ("TypeError: immutable" on its response headers; Portkey-AI/gateway issue 1389).
    """
    server = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    lock = PORTKEY_MANIFEST / "package-lock.json"
    installed_lock = PORTKEY_DIR / "package-lock.json"
    installed = server.exists() and installed_lock.exists()
    if installed and installed_lock.read_bytes() == lock.read_bytes():
        return server
    print(f"installing @portkey-ai/gateway@{PORTKEY_VERSION} into {PORTKEY_DIR} ...", flush=True)
    PORTKEY_DIR.mkdir(exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        (PORTKEY_DIR / name).write_bytes((PORTKEY_MANIFEST / name).read_bytes())
    npm = ["npm", "ci", "--prefix", str(PORTKEY_DIR), "--ignore-scripts", "--no-audit", "--no-fund"]
    subprocess.run(npm, check=True)
    return server


@contextmanager
def portkey_gateway(workdir: Path, upstream: str) -> Iterator[System]:
    server = ensure_portkey()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = ["node", str(server), f"--port={port}", "--headless"]
    with _served(command, f"{url}/", workdir / "portkey.log", 60, cwd=PORTKEY_DIR) as proc:
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": upstream,
            "Authorization": "Bearer fake-key",
        }
        yield System("portkey", f"{url}/v1", [proc.pid], "portkey", headers)


@contextmanager
def bare_forwarder(workdir: Path, upstream: str) -> Iterator[System]:
    port = free_port()
    script = REPO / "bench" / "bare_forwarder.py"
    command = [sys.executable, str(script), "--upstream", upstream, "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with _served(command, f"{url}/health", workdir / "forwarder.log", 30, cwd=REPO) as proc:
        yield System(FLOOR, f"{url}/v1", [proc.pid], "forwarder")


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not up in {timeout_s}s")


@contextmanager
def otlp_sink(workdir: Path) -> Iterator[tuple[str, int]]:
    """bench/otlp_sink.py running: its traces endpoint and its pid."""
    port = free_port()
    script = REPO / "bench" / "otlp_sink.py"
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, str(script), "--port", str(port)]
    with _served(command, f"{url}/health", workdir / "otlp-sink.log", 30, cwd=REPO) as proc:
        yield f"{url}/v1/traces", proc.pid


def _overrides(cache: bool) -> dict[str, Any]:
    overrides: dict[str, Any] = {"cache": {"backend": "memory" if cache else "off"}}
    # The benchmark's client is one tenant at up to 128 requests at once: room for all.
    pool = {"max_inflight": 256, "max_queued": 256}
    pool |= {"tenant_max_inflight": 256, "tenant_max_queued": 256}
    overrides["server"] = {"admission": {"queries": pool}}
    return overrides


@dataclass(frozen=True)
class Variant:
    """One setting weighed against querygate's default: one worker, cache off, twice side by
    side, once as configured by default and once with `overrides` laid over it."""

    suffix: str  # the variant's system name is querygate-1w<suffix>
    what: str  # what the table's "on" column is
    overrides: dict[str, Any]


def paired_querygates(
    workdir: Path, upstream: str, variant: Variant
) -> list[tuple[str, GatewayProcess]]:
    def start(on: bool) -> tuple[str, GatewayProcess]:
        overrides = _overrides(cache=False) | (variant.overrides if on else {})
        name = f"querygate-1w{variant.suffix if on else ''}"
        return name, start_gateway(workdir / name, upstream, overrides=overrides)

    with ThreadPoolExecutor(2) as threads:
        return list(threads.map(start, (False, True)))


def querygates(workdir: Path, upstream: str, cache: bool) -> list[tuple[str, GatewayProcess]]:
    """querygate with 1 and 2 workers, started side by side."""
    overrides = _overrides(cache)
    suffix = "+cache" if cache else ""

    def start(workers: int) -> tuple[str, GatewayProcess]:
        args = () if workers == 1 else ("--workers", str(workers))
        gw = start_gateway(
            workdir / f"qg{workers}{suffix}", upstream, overrides=overrides, serve_args=args
        )
        return f"querygate-{workers}w{suffix}", gw

    with ThreadPoolExecutor(2) as threads:
        return list(threads.map(start, (1, 2)))


# -- load -----------------------------------------------------------------------------------


def request_for(system: System, path: Path_, stream: bool) -> dict[str, Any]:
    if system.kind == "querygate":
        body: dict[str, Any] = {"model": path.model}
    else:
        body = {"model": "fake-small"}
    body["messages"] = [{"role": "user", "content": path.question}]
    if stream:
        body["stream"] = True
    return body


async def one(session: aiohttp.ClientSession, url: str, body: bytes, headers: Any) -> bool:
    async with session.post(url, data=body, headers=headers) as r:
        await r.read()  # streamed or not: the whole answer
        return r.status == 200


async def run_cell(
    session: aiohttp.ClientSession,
    system: System,
    path: Path_,
    stream: bool,
    concurrency: int,
    requests: int,
) -> Cell:
    url = f"{system.url}/chat/completions"
    body = json.dumps(request_for(system, path, stream)).encode()
    headers = {"Content-Type": "application/json", **system.headers}
    cell = Cell()
    left = iter(range(requests))

    async def worker() -> None:
        for _ in left:
            start = time.perf_counter()
            try:
                ok = await one(session, url, body, headers)
            except aiohttp.ClientError:
                ok = False
            cell.latencies_s.append(time.perf_counter() - start)
            cell.errors += not ok

    cpu0 = cpu_seconds(system.pids)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cell.wall_s = time.perf_counter() - started
    cell.cpu_s = cpu_seconds(system.pids) - cpu0
    return cell


def merge(into: Cell, cell: Cell) -> None:
    into.latencies_s += cell.latencies_s
    into.wall_s += cell.wall_s
    into.errors += cell.errors
    into.cpu_s += cell.cpu_s


Key = tuple[str, bool, int, str]  # path, stream, concurrency, system


async def measure(
    plain: list[System],
    cached: list[System],
    levels: list[int],
    scale: float,
    rounds: int,
    only: set[str] | None,
) -> dict[Key, Cell]:
    results: dict[Key, Cell] = defaultdict(Cell)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Prime: a cached answer for each cache path, and every system warm on every path.
        for system in cached:
            if system.kind == "querygate":
                prime = Path_("prime", "auto", SEMANTIC_PRIME, cache=True)
                await run_cell(session, system, prime, False, 1, 1)
        for system in plain + cached:
            for path in PATHS:
                if path.cache != (system in cached) or not _serves(system, path):
                    continue
                for stream in (False, True):
                    await run_cell(session, system, path, stream, 4, 24)
        turn = 0
        for concurrency in levels:
            requests = max(int(scale * max(150, 10 * concurrency)), concurrency * 2, 10)
            for path in PATHS:
                if only and path.name not in only:
                    continue
                systems = [s for s in (cached if path.cache else plain) if _serves(s, path)]
                for stream in (False, True):
                    for _ in range(rounds):
                        turn += 1
                        order = systems[turn % len(systems) :] + systems[: turn % len(systems)]
                        for system in order:
                            cell = await run_cell(
                                session, system, path, stream, concurrency, requests
                            )
                            merge(results[(path.name, stream, concurrency, system.name)], cell)
                    group = (path.name, stream, concurrency)
                    base = results[(*group, "upstream")]
                    print(
                        f"  c={concurrency:<3} {path.name:<12} stream={stream!s:<5} "
                        f"upstream p50 {base.pct(0.5):6.2f} ms; "
                        + "; ".join(
                            f"{s.name} {results[(*group, s.name)].rps:.0f}/s"
                            for s in systems
                            if s.kind != "upstream"
                        ),
                        flush=True,
                    )
    return results


def _serves(system: System, path: Path_) -> bool:
    if system.kind == "upstream":
        return True
    if system.kind == "litellm":
        return path.name != "semantic_hit"
    if system.kind in ("portkey", "forwarder"):
        return path.name == "passthrough"  # neither routes, retrieves nor (here) caches
    return True


# -- report ---------------------------------------------------------------------------------


def _ratio(value: float, floor: float) -> str:
    # An added latency at or under the raw upstream's (noise at c = 1) has no meaningful ratio.
    return f"{value / floor:.2f}x" if floor > 0 else "-"


def floor_table(results: dict[Key, Cell], levels: list[int]) -> str:
    """Pass-through as multiples of the bare forwarder's figures in the same cells, first."""
    lines = [
        "Pass-through against the bare forwarder (the floor: "
        + "ratios are system ÷ forwarder, same cell):",
        "",
        "| stream | c | system | CPU ÷ floor | added p50 ÷ floor | added p99 ÷ floor "
        "| CPU ms/req | added p50 ms | added p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for stream in (False, True):
        for c in levels:
            group = ("passthrough", stream, c)
            base, floor = results.get((*group, "upstream")), results.get((*group, FLOOR))
            if base is None or floor is None or not floor.n:
                continue
            floor_p50 = floor.pct(0.5) - base.pct(0.5)
            floor_p99 = floor.pct(0.99) - base.pct(0.99)
            names = [k[3] for k in results if k[:3] == group and k[3] != "upstream"]
            for name in sorted(names, key=lambda n: (n != FLOOR, n.startswith("querygate"), n)):
                cell = results[(*group, name)]
                p50, p99 = cell.pct(0.5) - base.pct(0.5), cell.pct(0.99) - base.pct(0.99)
                lines.append(
                    f"| {'yes' if stream else 'no'} | {c} | {name} "
                    f"| {_ratio(cell.cpu_ms, floor.cpu_ms)} | {_ratio(p50, floor_p50)} "
                    f"| {_ratio(p99, floor_p99)} | {cell.cpu_ms:.2f} | {p50:+.2f} | {p99:+.2f} |"
                )
    return "\n".join(lines) if len(lines) > 4 else ""  # no pass-through cell, no table


def table(results: dict[Key, Cell], levels: list[int], load: tuple[float, float]) -> str:
    lines = [
        f"Load average (1 min) before / after the run: {load[0]:.1f} / {load[1]:.1f} "
        f"on {os.cpu_count()} cores.",
        "",
        "| path | stream | c | system | req/s | added p50 ms | added p99 ms | CPU ms/req "
        "| req/s ÷ LiteLLM | CPU ÷ LiteLLM | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in PATHS:
        for stream in (False, True):
            for c in levels:
                base = results.get((path.name, stream, c, "upstream"))
                if base is None or not base.n:
                    continue
                ref_name = "litellm+cache" if path.cache else "litellm"
                ref = results.get((path.name, stream, c, ref_name))
                if ref is None and path.name == "semantic_hit":
                    ref = results.get(("exact_hit", stream, c, "litellm+cache"))
                lines.append(
                    f"| {path.name} | {'yes' if stream else 'no'} | {c} | raw upstream "
                    f"| {base.rps:.0f} | p50 {base.pct(0.5):.2f} | p99 {base.pct(0.99):.2f} "
                    "| - | | | |"
                )
                names = sorted(
                    {k[3] for k in results if k[:3] == (path.name, stream, c)} - {"upstream"},
                    key=lambda n: (not n.startswith("litellm"), n),
                )
                for name in names:
                    cell = results[(path.name, stream, c, name)]
                    if ref is not None and ref.n and not name.startswith("litellm"):
                        ratio_rps = f"{cell.rps / ref.rps:.2f}x"
                        ratio_cpu = f"{cell.cpu_ms / ref.cpu_ms:.2f}x" if ref.cpu_s else "-"
                    else:
                        ratio_rps = ratio_cpu = ""
                    lines.append(
                        f"| {path.name} | {'yes' if stream else 'no'} | {c} | {name} "
                        f"| {cell.rps:.0f} | {cell.pct(0.5) - base.pct(0.5):+.2f} "
                        f"| {cell.pct(0.99) - base.pct(0.99):+.2f} | {cell.cpu_ms:.2f} "
                        f"| {ratio_rps} | {ratio_cpu} | {cell.errors} |"
                    )
    return "\n".join(lines)


def paired_table(
    results: dict[Key, Cell], levels: list[int], load: tuple[float, float], variant: Variant
) -> str:
    """querygate with the variant ("on") against without it ("off"), same cells."""
    lines = [
        f"Load average (1 min) before / after the run: {load[0]:.1f} / {load[1]:.1f} "
        f"on {os.cpu_count()} cores. On: {variant.what}.",
        "",
        "| path | stream | c | CPU ms/req off | on | on ÷ off | added p50 ms off | on "
        "| req/s on ÷ off | errors on |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in PATHS:
        for stream in (False, True):
            for c in levels:
                group = (path.name, stream, c)
                base, off = results.get((*group, "upstream")), results.get((*group, "querygate-1w"))
                on = results.get((*group, f"querygate-1w{variant.suffix}"))
                if base is None or off is None or on is None or not (off.n and on.n):
                    continue
                added = (off.pct(0.5) - base.pct(0.5), on.pct(0.5) - base.pct(0.5))
                lines.append(
                    f"| {path.name} | {'yes' if stream else 'no'} | {c} | {off.cpu_ms:.2f} "
                    f"| {on.cpu_ms:.2f} | {on.cpu_ms / off.cpu_ms:.2f}x | {added[0]:+.2f} "
                    f"| {added[1]:+.2f} | {on.rps / off.rps:.2f}x | {on.errors} |"
                )
    return "\n".join(lines)


def write_docs(text: str, command: str) -> bool:
    if not DOCS.exists():
        return False
    doc = DOCS.read_text()
    if FIGURES_START not in doc or FIGURES_END not in doc:
        return False
    head, rest = doc.split(FIGURES_START, 1)
    _, tail = rest.split(FIGURES_END, 1)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = f"\n`{command}`, {stamp}.\n\n{text}\n"
    DOCS.write_text(head + FIGURES_START + body + FIGURES_END + tail)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--scale", type=float, default=1.0, help="requests per cell x this")
    parser.add_argument("--rounds", type=int, default=1, help="rotations per cell")
    parser.add_argument("--paths", nargs="+", choices=[p.name for p in PATHS])
    parser.add_argument("--no-2w", action="store_true", help="skip querygate with 2 workers")
    parser.add_argument("--write-docs", action="store_true")
    paired = parser.add_mutually_exclusive_group()
    paired.add_argument(
        "--tracing", action="store_true", help="querygate alone, tracing off against on"
    )
    paired.add_argument(
        "--rerank", action="store_true", help="querygate alone, the reranker off against local"
    )
    paired.add_argument(
        "--int8", action="store_true", help="querygate alone, the fp32 encoder against int8"
    )
    parser.add_argument(
        "--rerank-when",
        choices=("uncertain", "always"),
        default="uncertain",
        help="with --rerank: the shipped policy, or every lookup reranked (what one pays)",
    )
    args = parser.parse_args()
    if args.tracing or args.rerank or args.int8:
        paired_cost(args)
        return
    only = set(args.paths) if args.paths else None
    needs_cache = only is None or bool(only & {p.name for p in PATHS if p.cache})
    needs_plain = only is None or bool(only & {p.name for p in PATHS if not p.cache})
    load0 = os.getloadavg()[0]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="proxy-compare-")))
        upstream, upstream_pid = stack.enter_context(fake_upstream())
        raw = System("upstream", upstream, [upstream_pid], "upstream")
        plain: list[System] = [raw]
        cached: list[System] = [raw]
        groups = [(plain, False)] if needs_plain else []
        groups += [(cached, True)] if needs_cache else []
        if only is None or "passthrough" in only:
            plain.append(stack.enter_context(bare_forwarder(tmp, upstream)))
            plain.append(stack.enter_context(portkey_gateway(tmp, upstream)))
        for systems, cache in groups:
            systems.append(stack.enter_context(litellm_proxy(tmp, upstream, cache)))
            for name, gw in querygates(tmp, upstream, cache):
                if args.no_2w and "2w" in name:
                    stop_gateway(gw)
                    continue
                stack.callback(stop_gateway, gw)
                headers = {"Authorization": f"Bearer {KEYS['acme']}"}
                systems.append(System(name, f"{gw.url}/v1", [gw.proc.pid], "querygate", headers))
        print("systems up:", ", ".join(s.name for s in plain[1:] + cached[1:]), flush=True)
        results = asyncio.run(
            measure(
                plain if needs_plain else [],
                cached if needs_cache else [],
                args.concurrency,
                args.scale,
                args.rounds,
                only,
            )
        )
    load = (load0, os.getloadavg()[0])
    tables = (floor_table(results, args.concurrency), table(results, args.concurrency, load))
    text = "\n\n".join(t for t in tables if t)
    print(text)
    command = "python bench/proxy_compare.py " + " ".join(sys.argv[1:])
    if args.write_docs:
        if write_docs(text, command.replace(" --write-docs", "").strip()):
            print(f"\nwrote the figures section of {DOCS.relative_to(REPO)}")
        else:
            print(f"\n{DOCS.relative_to(REPO)} has no figures markers: paste the table above")


def paired_cost(args: argparse.Namespace) -> None:
    """--tracing or --rerank: querygate without and with it, on the paths without the cache."""
    uncached = {p.name for p in PATHS if not p.cache}
    only = (set(args.paths) if args.paths else uncached) & uncached
    load0 = os.getloadavg()[0]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="paired-cost-")))
        upstream, upstream_pid = stack.enter_context(fake_upstream())
        sink = stack.enter_context(otlp_sink(tmp))[0] if args.tracing else None
        variant = _variant(sink, args.rerank_when, args.int8)
        systems = [System("upstream", upstream, [upstream_pid], "upstream")]
        gateways = paired_querygates(tmp, upstream, variant)
        for name, gw in gateways:
            stack.callback(stop_gateway, gw)
            headers = {"Authorization": f"Bearer {KEYS['acme']}"}
            systems.append(System(name, f"{gw.url}/v1", [gw.proc.pid], "querygate", headers))
        results = asyncio.run(measure(systems, [], args.concurrency, args.scale, args.rounds, only))
        after = _variant_counts(sink, gateways[1][1], variant)
    print(paired_table(results, args.concurrency, (load0, os.getloadavg()[0]), variant))
    print(f"\n{after}")


def _variant(sink: str | None, rerank_when: str, int8: bool) -> Variant:
    if sink is not None:
        tracing = {"tracing": {"enabled": True, "endpoint": sink}}
        return Variant("+trace", "every request traced, spans exported over OTLP/HTTP", tracing)
    if int8:
        encoder = {"embeddings": {"precision": "int8"}}
        return Variant("+int8", "the int8 encoder (embeddings.precision: int8)", encoder)
    rerank = {"retrieval": {"rerank": {"reranker": "local", "when": rerank_when}}}
    if rerank_when == "always":
        return Variant("+rerank", "the local reranker on every lookup (when: always)", rerank)
    return Variant("+rerank", "the local reranker behind the shipped policy", rerank)


def _variant_counts(sink: str | None, gw: GatewayProcess, variant: Variant) -> str:
    """What the variant did: the spans the sink received, the rerank stage's decisions, or
    the encoder the variant's gateway logged at start."""
    import requests

    if "embeddings" in variant.overrides:
        lines = [json.loads(x) for x in gw.log().splitlines() if '"embedding runtime"' in x]
        return f"the variant's encoder, as it logged at start: {[x['runtime'] for x in lines]}"
    if sink is not None:
        exported = requests.get(sink.removesuffix("/v1/traces") + "/stats", timeout=5).json()
        return f"the OTLP sink received {exported.get('exports', 0)} exports, " + (
            f"{exported.get('bytes', 0)} bytes"
        )
    decisions = {
        dict(labels)["decision"]: int(value)
        for labels, value in gw.metrics().series("querygate_rerank_total").items()
    }
    return f"the rerank stage's decisions: {decisions}"


if __name__ == "__main__":
    main()
