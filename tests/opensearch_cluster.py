"""A throwaway three-node OpenSearch cluster for fault tests, from scripts/opensearch.sh's cluster
mode: the same distribution, plugins and install as the shared node, one JVM per node (512 MB
heap each) on its own HTTP port (transport: port + 100), every node cluster-manager eligible
and a data node.

    cluster = OpenSearchCluster.from_env()   # ports 9230-9232 unless
    cluster.start()                          # QUERYGATE_OPENSEARCH_CLUSTER_PORTS says otherwise
    cluster.kill(1)                          # SIGKILL: the JVM gone, its data left as it was
    cluster.restart(1)                       # the node rejoins from its own data
    cluster.stop()                           # every node stopped, its data deleted

The nodes never share a port with the suite's own nodes (9200, 9201). The fixture built on
this lives in tests/fixtures/opensearch.py; with QUERYGATE_OPENSEARCH_CLUSTER_KEEP=1 it leaves
the cluster running after the tests and reuses a whole one (a developer's next run skips the
start, minutes on a loaded machine).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "opensearch.sh"
PORTS_ENV = "QUERYGATE_OPENSEARCH_CLUSTER_PORTS"
KEEP_ENV = "QUERYGATE_OPENSEARCH_CLUSTER_KEEP"
DEFAULT_PORTS = "9230,9231,9232"
HEAP = "-Xms512m -Xmx512m"
# Three JVMs booting on a loaded 2-core runner; a node that exits is reported by the script.
START_TIMEOUT_S = 300.0
TRANSPORT_OFFSET = 100


def _port_taken(port: int) -> bool:
    """Whether something listens on `port` (connections of a node just stopped, in TIME_WAIT,
    do not count: the JVM binds with SO_REUSEADDR too)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass(frozen=True)
class OpenSearchCluster:
    ports: tuple[int, ...]

    @classmethod
    def from_env(cls) -> OpenSearchCluster:
        raw = os.environ.get(PORTS_ENV, DEFAULT_PORTS)
        return cls(tuple(int(p) for p in raw.split(",")))

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def node_name(self, index: int) -> str:
        return f"node-{self.ports[index]}"

    def start(self) -> None:
        """Fresh data on every node, all launched, then waited for: green with every node."""
        for index in range(len(self.ports)):
            self._script("wipe", index)
        taken = [
            p for port in self.ports for p in (port, port + TRANSPORT_OFFSET) if _port_taken(p)
        ]
        if taken:
            raise RuntimeError(f"ports {taken} are in use: set {PORTS_ENV} to free ones")
        self._script("launch", 0)  # installs the distribution once, if it is not yet
        with ThreadPoolExecutor(len(self.ports)) as pool:
            list(pool.map(lambda i: self._script("launch", i), range(1, len(self.ports))))
        self.wait_health(len(self.ports), "green")

    def whole(self) -> bool:
        """Whether the cluster runs now, green with every node (one kept from an earlier run)."""
        try:
            health = self.health()
        except RuntimeError:
            return False
        return bool(health["number_of_nodes"] == len(self.ports) and health["status"] == "green")

    def kill(self, index: int) -> None:
        self._script("kill", index)

    def restart(self, index: int) -> None:
        """Launch a killed node again; returns once its process runs (not once it joined)."""
        self._script("launch", index)

    def stop(self) -> None:
        for index in range(len(self.ports)):
            self._script("wipe", index)

    def request(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """A JSON request to the first node that answers it (a killed node refuses)."""
        error: Exception | None = None
        for url in self.urls:
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(f"{url}{path}", data=data, method=method)
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=30) as response:
                    return json.load(response)
            except (urllib.error.URLError, OSError) as exc:
                error = exc
        raise RuntimeError(f"no node answered {path}: {error}")

    def health(self) -> dict[str, Any]:
        found: dict[str, Any] = self.request("/_cluster/health")
        return found

    def wait_health(self, nodes: int, status: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the cluster has `nodes` nodes and is `status` (green: every shard copy placed)."""
        deadline = time.monotonic() + timeout_s
        query = f"wait_for_nodes={nodes}&wait_for_status={status}&timeout=2s"
        while True:
            try:
                health = self.request(f"/_cluster/health?{query}")
                if not health["timed_out"]:
                    return
            except RuntimeError:
                health = None
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not {status} with {nodes} nodes: {health}")
            time.sleep(0.5)

    def primary_holder(self, index_pattern: str) -> int:
        """The index in `ports` of the node holding the primary of `index_pattern`'s shard 0."""
        shards = self.request(f"/_cat/shards/{index_pattern}?format=json")
        for shard in shards:
            if shard["prirep"] == "p" and shard["shard"] == "0" and shard["state"] == "STARTED":
                return self.ports.index(int(shard["node"].removeprefix("node-")))
        raise RuntimeError(f"no started primary of {index_pattern}: {shards}")

    def _script(self, command: str, index: int) -> None:
        env = {
            **os.environ,
            "OPENSEARCH_PORT": str(self.ports[index]),
            "OPENSEARCH_CLUSTER_PORTS": ",".join(map(str, self.ports)),
            "OPENSEARCH_HEAP": HEAP,
        }
        try:
            done = subprocess.run(
                [str(SCRIPT), command],
                env=env,
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"opensearch.sh {command} on {self.ports[index]}: {exc}") from exc
        if done.returncode != 0:
            raise RuntimeError(f"opensearch.sh {command} on {self.ports[index]}: {done.stderr}")
