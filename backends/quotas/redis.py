"""Quotas in Redis, shared by every process that shares the server: one Lua script per update,
so each is atomic however many replicas race for the same tenant.

Keys (every key of a tenant carries the hash tag `{tenant}`, so on Redis Cluster each script's
keys sit in one slot, the same slot as the tenant's cache entries):

    qg:quota:{<tenant>}:bucket        hash {tokens, ts}: the request-rate token bucket
    qg:quota:{<tenant>}:spend:<day>   string, USD spent on that UTC day (INCRBYFLOAT)

The bucket is refilled with the server's clock (`TIME`), so replicas whose clocks disagree
still share one bucket; it expires once it would be full again (an absent bucket is a full
one, and so is one whose fields are not numbers: the script starts it afresh). A day's spend
expires an hour after that UTC day ends; a spend that is not a number is an error, never a
limit. The connection is not ours: the process's one `RedisConnection`
(`backends.redis_client`, short timeouts, no client retries) is opened and closed by
services.py; this store borrows it and stops using it at `aclose`. Every failure raises
`BackendError`: unreachable, too slow or refused is `BackendUnavailable` (the connection's one
map), an answer that is not a usable number is `UpstreamError`.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from backends.errors import UpstreamError
from backends.redis_client import RedisConnection

# The same sums as backends.quotas.memory.refill_and_take, on the server's clock. A clock
# that went backwards (a failover to a node whose clock lags) refills nothing.
TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = burst
  last = now
end
if now > last then
  tokens = math.min(burst, tokens + (now - last) * rate)
  last = now
end
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'ts', string.format('%.17g', last))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(burst / rate * 1000) + 1000))
return string.format('%.17g', wait)
"""

ADD_SPEND = """
local total = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('EXPIREAT', KEYS[1], ARGV[2])
return total
"""

# A day's total outlives its day by this much (a request that began at 23:59:59 records late).
SPEND_GRACE_S = 3600


def bucket_key(tenant: str) -> str:
    return f"qg:quota:{{{tenant}}}:bucket"


def spend_key(tenant: str, day: str) -> str:
    return f"qg:quota:{{{tenant}}}:spend:{day}"


def _day_end(day: str) -> int:
    start = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return int((start + dt.timedelta(days=1)).timestamp())


class RedisQuotaStore:
    name = "redis"

    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection
        self._take = connection.register_script(TAKE)
        self._add = connection.register_script(ADD_SPEND)
        self._closed = False

    async def take(self, tenant: str, rate_per_s: float, burst: float) -> float:
        reply = await self._call(self._take([bucket_key(tenant)], [repr(rate_per_s), burst]))
        return _number(reply, "bucket")

    async def spent(self, tenant: str, day: str) -> float:
        reply = await self._call(self._connection.client.get(spend_key(tenant, day)))
        return 0.0 if reply is None else _number(reply, "spend")

    async def add_spend(self, tenant: str, day: str, usd: float) -> float:
        expire_at = _day_end(day) + SPEND_GRACE_S
        reply = await self._call(self._add([spend_key(tenant, day)], [repr(usd), expire_at]))
        return _number(reply, "spend")

    async def ping(self) -> None:
        await self._call(self._connection.client.ping())

    async def aclose(self) -> None:
        self._closed = True

    async def _call(self, pending: Any) -> Any:
        if self._closed:
            pending.close()  # the coroutine never runs
            raise RuntimeError("the quota store is closed")
        return await self._connection.call(pending)


def _number(reply: Any, what: str) -> float:
    """A reply that must be a finite number; anything else is garbage, never a limit."""
    try:
        value = float(reply.decode() if isinstance(reply, bytes) else reply)
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise UpstreamError("redis", f"the {what} is not a number: {reply!r:.40}") from exc
    if not math.isfinite(value) or value < 0:
        raise UpstreamError("redis", f"the {what} is not a usable number: {value}")
    return value
