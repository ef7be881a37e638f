"""A node of a three-node OpenSearch cluster (one replica per shard) killed mid-traffic and
brought back, under a real `querygate serve` configured with all three nodes.

Designed behaviour (docs/opensearch.md, "A cluster, and a node dying"):
- queries keep answering, each within the request deadline: the client sends a call whose node
  is gone to another node (backends/retrieval/opensearch/client.py), and OpenSearch answers
  from the replicas of the shards the dead node held, promoting them to primaries;
- a write during the fault is acknowledged (200/201) or refused with a 503 the client may retry,
  and no acknowledged write is lost: every one is read back from the cluster once it is whole;
- `/readyz` stays 200 and `querygate_dependency_up{dependency="retrieval"}` 1 while the cluster
  is yellow (one node down, every shard still has a copy serving): retrieval answers in full,
  and taking every replica of the gateway out of the load balancer would turn a fault the
  cluster absorbs into an outage; `/readyz` names the cluster's state in its retrieval check
  (`degraded`); with the cluster red or without a cluster manager it is 503 and the gauge 0;
- everything recovers without a restart: the node rejoins, its shards are copied back (green).

The figures (requests, failures, p99 during the fault, time to recover) are printed: run with
`-s` to see them (docs/benchmarks.md, "Faults of the distributed engines").
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import requests

from backends.retrieval.opensearch import OpenSearchRetriever
from backends.retrieval.opensearch.config import OpenSearchConfig
from tests.fixtures.gateway import GatewayProcess, free_port, start_gateway, stop_gateway
from tests.fixtures.opensearch import CI_TIMEOUTS
from tests.opensearch_cluster import OpenSearchCluster

DEADLINE_S = 10.0
# A client that waited this long past the gateway's deadline got no answer: a hang.
HANG_S = 30.0
QUERY_CLIENTS = 3
# Bounds only waits for what the test caused, sized for a loaded CI machine (a node's JVM boot
# and shard recovery); nothing asserts on them.
RECOVER_WITHIN_S = 300.0


@dataclass(frozen=True)
class Outcome:
    kind: str  # "query" or "write"
    at: float  # time.monotonic() when it was sent
    status: int
    elapsed_s: float
    doc_id: str | None = None


@pytest.fixture(scope="module")
def cluster_gateway(
    fake_upstream: str,
    opensearch_cluster: OpenSearchCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, OpenSearchConfig]]:
    section = {
        "hosts": opensearch_cluster.urls,
        "alias": f"qg-faults-{uuid.uuid4().hex[:8]}",
        "number_of_replicas": 1,
        "search_timeout_s": 5.0,
    }
    overrides = {"server": {"request_timeout_s": DEADLINE_S}, "cache": {"backend": "off"}}
    gw = start_gateway(
        tmp_path_factory.mktemp("cluster-faults"),
        fake_upstream,
        {"backend": "opensearch", "opensearch": section},
        overrides=overrides,
    )
    yield gw, OpenSearchConfig(**section)
    stop_gateway(gw)


def query(gw: GatewayProcess) -> Outcome:
    body = {
        "query": f"What does the Acme warranty cover? {uuid.uuid4().hex[:6]}",
        "route": "lookup",
    }
    started = time.monotonic()
    try:
        resp = requests.post(
            f"{gw.url}/v1/query", json=body, headers=gw.headers(), timeout=DEADLINE_S + HANG_S
        )
    except requests.Timeout:
        pytest.fail(f"no answer within {DEADLINE_S + HANG_S:g} s: the gateway hung")
    return Outcome("query", started, resp.status_code, time.monotonic() - started)


def write(gw: GatewayProcess) -> Outcome:
    doc_id = f"fault-{uuid.uuid4().hex[:10]}"
    text = f"Fault note {doc_id}: the Acme relay is reset by holding its button."
    started = time.monotonic()
    resp = requests.put(
        f"{gw.url}/v1/documents/{doc_id}",
        json={"title": doc_id, "text": text},
        headers=gw.headers(),
        timeout=DEADLINE_S + HANG_S + 60,
    )
    return Outcome("write", started, resp.status_code, time.monotonic() - started, doc_id)


def under_traffic(gw: GatewayProcess, fault: Callable[[], None]) -> list[Outcome]:
    """Query clients and one writer without pause while `fault` runs; every outcome."""
    stop, lock = threading.Event(), threading.Lock()
    outcomes: list[Outcome] = []

    def client(send: Callable[[GatewayProcess], Outcome]) -> None:
        while not stop.is_set():
            outcome = send(gw)
            with lock:
                outcomes.append(outcome)

    with ThreadPoolExecutor(QUERY_CLIENTS + 1) as pool:
        futures = [pool.submit(client, query) for _ in range(QUERY_CLIENTS)]
        futures.append(pool.submit(client, write))
        try:
            time.sleep(2.0)
            fault()
            time.sleep(2.0)
        finally:
            stop.set()
        for future in futures:
            future.result()
    return outcomes


def retrieval_up(gw: GatewayProcess) -> float | None:
    return gw.metrics().get("querygate_dependency_up", dependency="retrieval")


def stored_ids(cluster: OpenSearchCluster, config: OpenSearchConfig, ids: list[str]) -> set[str]:
    """Which of `ids` have a visible chunk in the acme tenant's index, read from the cluster."""
    alias = config.tenant_alias("acme")
    cluster.request(f"/{alias}/_refresh", method="POST")
    body = {
        "size": 10_000,
        "_source": ["doc_id"],
        "query": {
            "bool": {
                "filter": [{"terms": {"doc_id": ids}}],
                "must_not": [{"term": {"pending": True}}],
            }
        },
    }
    found = cluster.request(f"/{alias}/_search", method="POST", body=body)
    return {hit["_source"]["doc_id"] for hit in found["hits"]["hits"]}


def p99(seconds: list[float]) -> float:
    return statistics.quantiles(seconds, n=100)[98] if len(seconds) > 1 else max(seconds)


def test_a_node_killed_mid_traffic_and_brought_back(
    cluster_gateway: tuple[GatewayProcess, OpenSearchConfig],
    opensearch_cluster: OpenSearchCluster,
) -> None:
    gw, config = cluster_gateway
    cluster = opensearch_cluster
    cluster.wait_health(3, "green", RECOVER_WITHIN_S)  # the replicas of what was ingested
    victim = cluster.primary_holder(f"{config.tenant_alias('acme')}*")
    marks: dict[str, float] = {}
    seen: dict[str, object] = {}

    def kill_wait_and_restart() -> None:
        marks["killed"] = time.monotonic()
        cluster.kill(victim)
        cluster.wait_health(2, "yellow", RECOVER_WITHIN_S)
        marks["yellow"] = time.monotonic()
        # What the gateway says with one node down: read after a dependency probe ran
        # (every 10 s), traffic flowing meanwhile.
        time.sleep(11.0)
        ready = requests.get(f"{gw.url}/readyz", timeout=10)
        seen["readyz"], seen["checks"] = ready.status_code, ready.json()["checks"]
        seen["up"] = retrieval_up(gw)
        marks["restart"] = time.monotonic()
        cluster.restart(victim)
        cluster.wait_health(3, "green", RECOVER_WITHIN_S)
        marks["green"] = time.monotonic()

    outcomes = under_traffic(gw, kill_wait_and_restart)

    queries = [o for o in outcomes if o.kind == "query"]
    writes = [o for o in outcomes if o.kind == "write"]
    failed_queries = [o for o in queries if o.status != 200]
    failed_writes = [o for o in writes if o.status not in (200, 201)]
    during = [o.elapsed_s for o in queries if marks["killed"] <= o.at <= marks["green"]]
    acked = [o.doc_id for o in writes if o.status in (200, 201) and o.doc_id]
    print(
        f"\nopensearch node {cluster.node_name(victim)} killed: {len(queries)} queries, "
        f"{len(failed_queries)} failed; {len(writes)} writes, {len(failed_writes)} refused; "
        f"query p99 during the fault {p99(during) * 1000:.0f} ms over {len(during)}; "
        f"yellow {marks['yellow'] - marks['killed']:.1f} s after the kill, green again "
        f"{marks['green'] - marks['restart']:.1f} s after the restart"
    )
    assert not failed_queries, failed_queries[:5]
    # A refused write is the client's to retry: a 503 with Retry-After, never a 500.
    assert {o.status for o in failed_writes} <= {503}, failed_writes[:5]
    assert acked, "no write was acknowledged"
    missing = set(acked) - stored_ids(cluster, config, acked)
    assert not missing, f"{len(missing)} acknowledged writes lost: {sorted(missing)[:5]}"
    assert seen["readyz"] == 200, seen
    assert seen["checks"]["retrieval"] == "degraded", seen  # type: ignore[index]
    assert seen["up"] == 1.0, seen
    ready = requests.get(f"{gw.url}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["checks"]["retrieval"] == "ok", ready.text


def test_a_client_given_a_dead_node_among_its_hosts_never_fails_a_call(
    opensearch_cluster: OpenSearchCluster,
) -> None:
    """Half the calls would go to the dead host first (opensearch-py rotates over its hosts):
    each goes again to the live one."""
    dead = f"http://127.0.0.1:{free_port()}"
    config = OpenSearchConfig(
        hosts=(dead, opensearch_cluster.urls[0]),
        alias=f"qg-dead-{uuid.uuid4().hex[:8]}",
        **CI_TIMEOUTS,
    )

    async def calls() -> list[str | None]:
        retriever = OpenSearchRetriever(config)
        try:
            await retriever.ensure_index()
            return [await retriever.ping() for _ in range(10)]
        finally:
            await retriever.drop_all()
            await retriever.aclose()

    assert asyncio.run(calls()) == [None] * 10
