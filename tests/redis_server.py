"""Throwaway redis-server processes for tests and benchmarks: one node, or a cluster of three
masters (each with a replica when asked: `running_redis_cluster(replicas=1)`).

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
    with running_redis_cluster(replicas=1) as cluster:
        cluster.kill_master_of("qg:quota:{acme}:bucket")   # its replica takes over
        cluster.wait_master_of("qg:quota:{acme}:bucket")    # failed over: the new master

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
    """Masters (and their replicas) with every slot assigned and cluster_state:ok."""

    nodes: list[RedisServer]

    @property
    def urls(self) -> list[str]:
        """Plain redis:// URLs of the nodes (cluster mode has only database 0)."""
        return [f"redis://{node.address}" for node in self.nodes]

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout_s: float = CLUSTER_TIMEOUT_S) -> None:
        """Every live node says cluster_state:ok: all 16384 slots are served (after a master
        died, once its replica has taken over)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if all(b"cluster_state:ok" in n.command("CLUSTER", "INFO") for n in self.live()):
                    return
            time.sleep(0.05)
        raise RuntimeError("Redis Cluster not ok: " + "; ".join(n.log_tail(5) for n in self.nodes))

    def wait_replicated(self, replicas: int, timeout_s: float = CLUSTER_TIMEOUT_S) -> None:
        """Until `replicas` replicas have synced with their masters (one that has not could
        not take over)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                infos = [n.command("INFO", "replication") for n in self.live()]
                if sum(b"master_link_status:up" in info for info in infos) >= replicas:
                    return
            time.sleep(0.05)
        raise RuntimeError("Redis Cluster replicas not in sync")

    def wait_caught_up(self, index: int, timeout_s: float = CLUSTER_TIMEOUT_S) -> None:
        """Until every replica of master `index` has acknowledged all the master sent it:
        replication is asynchronous, so a write the master took may not yet be on the replica
        that takes over when it dies (replicas acknowledge once a second)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.nodes[index].command("INFO", "replication").decode()
            fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
            sent = int(fields.get("master_repl_offset", "0").strip())
            acked = [
                int(dict(kv.split("=", 1) for kv in value.strip().split(","))["offset"])
                for name, value in fields.items()
                if name.startswith("slave") and name[5:].isdigit()
            ]
            if acked and min(acked) >= sent:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the replicas of node {index} did not catch up")

    def master_of(self, key: str) -> int:
        """The index in `nodes` of the live master that serves `key`'s slot now."""
        slot = int(self.live()[0].command("CLUSTER", "KEYSLOT", key)[1:].strip())
        for index, node in enumerate(self.nodes):
            if node not in self.live():
                continue
            role = node.command("ROLE")
            if b"master" in role.split(b"\r\n")[2] and slot in self._own_slots(node):
                return index
        raise RuntimeError(f"no live master serves slot {slot}")

    def wait_master_of(self, key: str, timeout_s: float = CLUSTER_TIMEOUT_S) -> int:
        """`master_of(key)` once a live master serves its slot (its replica took over) and
        the cluster is ok."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                index = self.master_of(key)
                self.wait_ok(max(0.0, deadline - time.monotonic()))
                return index
            except (RuntimeError, OSError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def kill_master_of(self, key: str) -> int:
        """SIGKILL the master serving `key`; its index in `nodes`."""
        index = self.master_of(key)
        self.nodes[index].kill()
        return index

    def restart(self, index: int) -> None:
        """Bring one killed node back; it rejoins from its nodes.conf (a master that was failed
        over comes back as its successor's replica, and is waited for until it has synced: a
        replica that never has could not take over in turn)."""
        node = self.nodes[index]
        node.restart()
        self.wait_ok()
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while b"slave" in node.command("ROLE").split(b"\r\n")[2]:
            if b"master_link_status:up" in node.command("INFO", "replication"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {node.address} not in sync: {node.log_tail(5)}")
            time.sleep(0.05)

    @staticmethod
    def _own_slots(node: RedisServer) -> set[int]:
        """The slots `node` serves, from its own line of CLUSTER NODES ("myself")."""
        raw = node.command("CLUSTER", "NODES").decode()
        for line in raw.splitlines():
            fields = line.split()
            if len(fields) > 8 and "myself" in fields[2]:
                slots: set[int] = set()
                for span in fields[8:]:
                    if span.startswith("["):
                        continue  # a slot being migrated
                    low, _, high = span.partition("-")
                    slots.update(range(int(low), int(high or low) + 1))
                return slots
        return set()


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
def running_redis_cluster(masters: int = 3, replicas: int = 0) -> Iterator[RedisCluster]:
    """A Redis Cluster of `masters` masters, each with `replicas` replicas, created with
    `redis-cli --cluster create`, yielded once cluster_state is ok on every node. `nodes` lists
    the masters first (as created; a failover changes who is master: `master_of`)."""
    root = _make_dir(None, "qg-redis-cluster")
    nodes: list[RedisServer] = []
    try:
        for index in range(masters * (1 + replicas)):
            nodes.append(RedisServer(
                free_port(with_bus=True),
                _make_dir(root, f"node{index}"),
                (
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    # Short, so a killed node is marked failed (and failed over) quickly.
                    "--cluster-node-timeout", "2000",
                ),
            ))  # fmt: skip
            nodes[-1].start()
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *(n.address for n in nodes),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=CLUSTER_TIMEOUT_S,
        )  # fmt: skip
        cluster = RedisCluster(nodes)
        cluster.wait_ok()
        if replicas:
            cluster.wait_replicated(masters * replicas)
        yield cluster
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(root, ignore_errors=True)
