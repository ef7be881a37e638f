"""The Redis test helpers do what the other tests rely on: a kill is an outage, a restart ends
it, a pause is a Redis that never answers, and the cluster serves every slot."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster as ClusterClient

from tests.redis_server import RedisCluster, RedisServer

pytestmark = pytest.mark.integration


def test_killed_server_refuses_and_restart_serves_again(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=1, socket_connect_timeout=1)
    assert client.ping()
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    redis_server.restart()
    assert client.ping()


def test_paused_server_times_out_and_resume_answers(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.2)
    assert client.ping()
    redis_server.pause()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    redis_server.resume()
    client.connection_pool.disconnect()  # the timed-out connection holds a stale reply
    assert client.ping()


def test_cluster_spreads_keys_over_three_masters(redis_cluster: RedisCluster) -> None:
    client = ClusterClient.from_url(redis_cluster.urls[0])
    keys = [f"key-{i}" for i in range(60)]
    for i, key in enumerate(keys):
        client.set(key, i)
    assert [int(client.get(key)) for key in keys] == list(range(60))
    owners = {client.get_node_from_key(key).port for key in keys}
    assert len(owners) == 3
    client.close()
