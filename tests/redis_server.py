"""Throwaway redis-server processes for tests and benchmarks: one node, or a three-master cluster.

Each server is its own process from the Debian `redis-server` binary (Redis 7.0 here), on a free
loopback port, with no persistence (`save ""`, no AOF) and its own temporary directory, so a
test never touches a developer's Redis nor another test's. Tests take Redis down mid-traffic
with `kill()` (SIGKILL: connections reset, nothing answers), `pause()` (SIGSTOP: connections
are accepted by the kernel but nothing answers, i.e. a *slow* Redis, so timeouts fire) and bring
it back with `restart()` (same port, same directory) or `resume()`.

    with running_redis() as server:            # server.url == "redis://127.0.0.1:PORT/0"
        ...
    with running_redis_cluster() as cluster:   # cluster.urls: one redis:// URL per master
        ...

The pytest fixtures built on these live in tests/fixtures/redis.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REDIS_SERVER = os.environ.get("REDIS_SERVER_BIN", "redis-server")
REDIS_CLI = os.environ.get("REDIS_CLI_BIN", "redis-cli")
START_TIMEOUT_S = 10.0
CLUSTER_TIMEOUT_S = 30.0
# A cluster node's bus listens on its port + 10000, so both must be free.
CLUSTER_BUS_OFFSET = 10_000


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port nothing listens on (and, for a cluster node, its bus port too)."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if not with_bus:
            return port
        if port + CLUSTER_BUS_OFFSET < 65536 and _port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _command(port: int, *args: str, timeout_s: float = 1.0) -> bytes:
    """One command in RESP over a plain socket: no client library between the test and the
    server it is checking, so a helper's verdict never depends on the code under test."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        raw = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(raw), raw)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        reply = b""
        sock.settimeout(timeout_s)
        while True:
            chunk = sock.recv(65536)
            reply += chunk
            if not chunk or _complete(reply):
                return reply


def _complete(reply: bytes) -> bool:
    """True once a simple/error/integer reply or one whole bulk string has arrived."""
    if not reply.endswith(b"\r\n"):
        return False
    if reply[:1] != b"$":
        return True
    header, _, rest = reply.partition(b"\r\n")
    length = int(header[1:])
    return length < 0 or len(rest) >= length + 2


@dataclass
class RedisServer:
    """One redis-server process. `url` stays valid across kill/restart (same port)."""

    port: int
    directory: Path
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server on {self.port} is already running")
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--logfile", str(self.log_path),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--protected-mode", "no",
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.wait_ready()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                if _command(self.port, "PING").startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError(
            f"redis-server on {self.port} not ready (exit code "
            f"{self.proc.poll() if self.proc else None}): {self.log_tail()}"
        )

    def command(self, *args: str) -> bytes:
        """The raw RESP reply to one command, for tests that look past the store."""
        return _command(self.port, *args)

    def kill(self) -> None:
        """SIGKILL: the server is gone at once; clients see resets and refused connections."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a paused process must still die promptly
        self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Start again on the same port and directory (data is gone: no persistence)."""
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections still open at the TCP level, but no reply ever comes."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class RedisCluster:
    """Three (or more) masters with every slot assigned and cluster_state:ok."""

    nodes: list[RedisServer]

    @property
    def urls(self) -> list[str]:
        """Plain redis:// URLs of the masters (cluster mode has only database 0)."""
        return [f"redis://{node.address}" for node in self.nodes]

    def wait_ok(self, timeout_s: float = CLUSTER_TIMEOUT_S) -> None:
        """Every node says cluster_state:ok: all 16384 slots are served."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if all(b"cluster_state:ok" in n.command("CLUSTER", "INFO") for n in self.nodes):
                    return
            time.sleep(0.05)
        raise RuntimeError("Redis Cluster not ok: " + "; ".join(n.log_tail(5) for n in self.nodes))

    def restart(self, index: int) -> None:
        """Bring one killed master back; it rejoins from its nodes.conf with its slots."""
        self.nodes[index].restart()
        self.wait_ok()


def _make_dir(parent: Path | None, name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent))


@contextlib.contextmanager
def running_redis(extra_args: tuple[str, ...] = ()) -> Iterator[RedisServer]:
    """A fresh single-node redis-server, stopped and its directory removed on exit."""
    directory = _make_dir(None, "qg-redis")
    server = RedisServer(free_port(), directory, extra_args)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def running_redis_cluster(masters: int = 3) -> Iterator[RedisCluster]:
    """A Redis Cluster of `masters` masters and no replicas, created with
    `redis-cli --cluster create`, yielded once cluster_state is ok on every node."""
    root = _make_dir(None, "qg-redis-cluster")
    nodes: list[RedisServer] = []
    try:
        for index in range(masters):
            nodes.append(RedisServer(
                free_port(with_bus=True),
                _make_dir(root, f"node{index}"),
                (
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    # Short, so a killed node is marked failed quickly in tests.
                    "--cluster-node-timeout", "2000",
                ),
            ))  # fmt: skip
            nodes[-1].start()
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *(n.address for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=CLUSTER_TIMEOUT_S,
        )  # fmt: skip
        cluster = RedisCluster(nodes)
        cluster.wait_ok()
        yield cluster
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(root, ignore_errors=True)
