"""Quotas in Redis, shared by every process that shares the server: one Lua script per update,
so each is atomic however many replicas race for the same tenant.

Keys (every key of a tenant carries the hash tag `{tenant}`, so on Redis Cluster each script's
keys sit in one slot, the same slot as the tenant's cache entries):

    qg:quota:{<tenant>}:bucket                hash {tokens, ts}: the request-rate token bucket
    qg:quota:{<tenant>}:spend:<day>           string, USD spent on that UTC day (INCRBYFLOAT)
    qg:quota:{<tenant>}:spend:<day>:seen      hash, per process that added spend that day (its
                                              origin), the sequence number of its latest amount

The bucket is refilled with the server's clock (`TIME`), so replicas whose clocks disagree
still share one bucket; it expires once it would be full again (an absent bucket is a full
one, and so is one whose fields are not numbers: the script starts it afresh).

Each amount of spend carries an id chosen by the process that records it: `<origin>:<seq>`,
its process's random origin and a number that grows with each amount it sends. A process sends
a (tenant, day)'s amounts one at a time, in order, and sends an amount that failed (maybe
applied, its reply lost) again before any later one. So the script adds an amount only if its
number is above the one recorded for its origin, and records it, in the same atomic script: a
replay, however late and whatever other processes added meanwhile, is not counted twice, and
what is kept per tenant and day is one field per process, not per amount (a field per amount
grows with every call all day; a window of the newest ids counts a replay again once other
replicas have added a window's worth meanwhile). Both keys expire an hour after that UTC day
ends (Redis keeps them that hour only for a process that records the last calls of the day a
little late; the budget itself resets at 00:00 UTC, as a new day is a new key).

A key that holds something unusable (another type: WRONGTYPE; a spend that is not a number) is
that tenant's problem, not Redis's: it raises `UpstreamError`, and `repair` rewrites only the
keys that are unusable. Unreachable, too slow or refused is `BackendUnavailable` (the
connection's one map). The connection is not ours: the process's one `RedisConnection`
(`backends.redis_client`, short timeouts, no client retries) is opened and closed by
services.py; this store borrows it and stops using it at `aclose`.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from redis.exceptions import ResponseError

from backends.errors import BackendUnavailable, UpstreamError
from backends.redis_client import RedisConnection, RequestSpend

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
-- Lua's tonumber reads 'nan' and 'inf': a ts of nan or inf would never refill, a tokens of
-- -inf never be taken. Those are not numbers either; nor is a negative tokens.
if tokens == nil or last == nil or tokens ~= tokens or last ~= last or tokens < 0
   or tokens == math.huge or math.abs(last) == math.huge then
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

# TAKE and, in the same script, the day's spend: a request's two checks in one round trip.
# KEYS: the bucket, the day's spend (one tenant: one hash tag, one slot on a cluster). The
# spend is read first: a WRONGTYPE there fails the script before the bucket is written.
TAKE_AND_SPENT = "\nlocal spend = redis.call('GET', KEYS[2]) or '0'" + TAKE.replace(
    "return string.format('%.17g', wait)", "return {string.format('%.17g', wait), spend}"
)

# KEYS: the day's spend, its senders' latest numbers. ARGV: USD, expiry (unix s), the amount's
# id (`<origin>:<seq>`; '' for none: added without one). Everything that can fail is checked
# before the first write (a script is not rolled back: a number recorded whose amount then
# failed to add would be lost).
ADD_SPEND = """
local current = redis.call('GET', KEYS[1])
local n = current and tonumber(current)
if current and (n == nil or n ~= n or n < 0 or n == math.huge) then
  return redis.error_reply('ERR value is not a valid float (the day spend)')
end
local id = ARGV[3]
if id ~= '' then
  local origin, seq = string.match(id, '^(.+):(%d+)$')
  if not origin then
    return redis.error_reply('ERR an amount id is <origin>:<number>')
  end
  local last = tonumber(redis.call('HGET', KEYS[2], origin))
  if last and tonumber(seq) <= last then
    return current or '0'
  end
  redis.call('HSET', KEYS[2], origin, seq)
  redis.call('EXPIREAT', KEYS[2], ARGV[2])
end
local total = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('EXPIREAT', KEYS[1], ARGV[2])
return total
"""

# KEYS: bucket, the day's spend, its senders' numbers. ARGV: USD to set an unusable spend to,
# expiry. Only a key that is unusable is touched; returns how many were.
REPAIR = """
local fixed = 0
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  redis.call('DEL', KEYS[1])
  fixed = fixed + 1
end
kind = redis.call('TYPE', KEYS[2])['ok']
local n = nil
if kind == 'string' then n = tonumber(redis.call('GET', KEYS[2])) end
if kind ~= 'none' and (n == nil or n ~= n or n < 0 or n == math.huge) then
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[2], ARGV[1])
  redis.call('EXPIREAT', KEYS[2], ARGV[2])
  fixed = fixed + 1
end
kind = redis.call('TYPE', KEYS[3])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  redis.call('DEL', KEYS[3])
  fixed = fixed + 1
end
return fixed
"""

# How long a day's keys outlive the day: only so a call that ends just after 00:00 UTC can
# still be recorded on the day it began. It does not extend the day's budget.
SPEND_GRACE_S = 3600

# What a ResponseError says when the key it touched holds something unusable (another type, a
# total that is not a number): that tenant's data, not Redis's availability.
_DATA_ERRORS = ("WRONGTYPE", "not a valid float", "not an integer")


def bucket_key(tenant: str) -> str:
    return f"qg:quota:{{{tenant}}}:bucket"


def spend_key(tenant: str, day: str) -> str:
    return f"qg:quota:{{{tenant}}}:spend:{day}"


def applied_key(tenant: str, day: str) -> str:
    """Per process (origin), the number of its latest amount added that day (a hash)."""
    return f"{spend_key(tenant, day)}:seen"


def _day_end(day: str) -> int:
    start = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return int((start + dt.timedelta(days=1)).timestamp())


class RedisQuotaStore:
    name = "redis"

    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection
        self._take = connection.register_script(TAKE)
        self._take_and_spent = connection.register_script(TAKE_AND_SPENT)
        self._add = connection.register_script(ADD_SPEND)
        self._repair = connection.register_script(REPAIR)
        self._closed = False

    async def take(
        self, tenant: str, rate_per_s: float, burst: float, *, spend: RequestSpend | None = None
    ) -> float:
        reply = await self._call(self._take([bucket_key(tenant)], [repr(rate_per_s), burst]), spend)
        return _number(reply, "bucket")

    async def take_and_spent(
        self,
        tenant: str,
        rate_per_s: float,
        burst: float,
        day: str,
        *,
        spend: RequestSpend | None = None,
    ) -> tuple[float, float]:
        keys = [bucket_key(tenant), spend_key(tenant, day)]
        reply = await self._call(self._take_and_spent(keys, [repr(rate_per_s), burst]), spend)
        if not isinstance(reply, list) or len(reply) != 2:
            raise UpstreamError("redis", f"the bucket script answered {reply!r:.40}")
        return _number(reply[0], "bucket"), _number(reply[1], "spend")

    async def spent(self, tenant: str, day: str, *, spend: RequestSpend | None = None) -> float:
        reply = await self._call(self._connection.client.get(spend_key(tenant, day)), spend)
        return 0.0 if reply is None else _number(reply, "spend")

    async def add_spend(self, tenant: str, day: str, usd: float, amount_id: str) -> float:
        expire_at = _day_end(day) + SPEND_GRACE_S
        keys = [spend_key(tenant, day), applied_key(tenant, day)]
        reply = await self._call(self._add(keys, [repr(usd), expire_at, amount_id]))
        return _number(reply, "spend")

    async def repair(
        self, tenant: str, day: str, usd: float, *, spend: RequestSpend | None = None
    ) -> None:
        keys = [bucket_key(tenant), spend_key(tenant, day), applied_key(tenant, day)]
        await self._call(self._repair(keys, [repr(usd), _day_end(day) + SPEND_GRACE_S]), spend)

    async def ping(self) -> None:
        if self._closed:
            raise BackendUnavailable("redis", "the quota store is closed")
        await self._connection.ping()

    async def aclose(self) -> None:
        self._closed = True

    async def _call(self, pending: Any, spend: RequestSpend | None = None) -> Any:
        if self._closed:
            pending.close()  # the coroutine never runs
            raise BackendUnavailable("redis", "the quota store is closed")
        try:
            return await self._connection.call(pending, spend)
        except BackendUnavailable as exc:
            cause = exc.__cause__
            # Exactly ResponseError: its subclasses (READONLY, OOM, CLUSTERDOWN, ...) are
            # the server's state, which is every tenant's.
            if type(cause) is ResponseError and any(m in str(cause) for m in _DATA_ERRORS):
                raise UpstreamError("redis", f"a quota key is unusable: {cause}") from exc
            raise


def _number(reply: Any, what: str) -> float:
    """A reply that must be a finite number; anything else is garbage, never a limit."""
    try:
        value = float(reply.decode() if isinstance(reply, bytes) else reply)
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise UpstreamError("redis", f"the {what} is not a number: {reply!r:.40}") from exc
    if not math.isfinite(value) or value < 0:
        raise UpstreamError("redis", f"the {what} is not a usable number: {value}")
    return value
