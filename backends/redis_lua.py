"""Lua scripts on Redis or Redis Cluster, loaded again on the node that lacks one.

Every store of the gateway (cache, quotas) runs its updates as Lua scripts by EVALSHA, through
`RedisConnection.register_script`, which makes a `Script` here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

Client = Redis | RedisCluster


class Script:
    """A Lua script run by EVALSHA on the node its keys live on, and loaded on that node when it
    lacks it: a Redis restarted empty, or a replica just promoted by a failover (Redis does not
    replicate its script cache). redis-py's own reload (`AsyncScript`) sends SCRIPT LOAD to the
    masters its slot map lists, and after a failover that map keeps the promoted replica's old
    role (redis-py 7.4 keeps a node it already knew as it was), so the reload never reaches the
    new master and every call of the script to that master's slots fails until the process
    restarts. Loading it where the call ran recovers at the first call instead."""

    def __init__(self, client: Client, source: str) -> None:
        self._client = client
        self._source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Any:
        client = cast(Any, self._client)
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._load(keys)
            return await client.evalsha(self.sha, len(keys), *keys, *args)

    async def _load(self, keys: Sequence[str]) -> None:
        if isinstance(self._client, RedisCluster) and keys:
            node = self._client.get_node_from_key(keys[0])
            await self._client.execute_command("SCRIPT", "LOAD", self._source, target_nodes=node)
        else:
            await self._client.script_load(self._source)
