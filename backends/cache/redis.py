"""Redis cache store: entries shared by every replica, plain commands and Lua only.

No module is needed (no RediSearch, no vector sets), so it runs on Redis 7, Valkey and managed
services alike. The client is borrowed from `backends.redis_client.RedisConnection`: this
store never builds or closes one, and every call goes through its timeout and error map, so a
down, slow or garbled Redis is a `BackendUnavailable` within `op_timeout_s`.

Keys. Every key of a tenant carries the hash tag `{tenant}`, so on Redis Cluster all of a
tenant's keys share one slot and every script declares all the keys it touches (a tenant's
cache is a fixed set of eight keys, plus one lease key per single-flight claim):

    qg:cache:{T}:seq    string  entry ids (INCR), zero-padded so lexical order is age order
    qg:cache:{T}:keys   hash    exact key -> id
    qg:cache:{T}:ent    hash    id -> entry (key, question, payload; versioned binary)
    qg:cache:{T}:vec    hash    id -> expiry (13 digits) + unit vector, float16 (768 bytes at 384-d)
    qg:cache:{T}:meta   hash    id -> what removing it must undo (LSH members, exact key)
    qg:cache:{T}:ord    zset    id by insertion order: the per-tenant cap evicts the oldest
    qg:cache:{T}:exp    zset    id by expiry (ms, server clock): fixed at write, never moved
    qg:cache:{T}:lsh    zset    LSH bucket members, lexical: scope|band|bucket:id
    qg:cache:{T}:lease:<key>    string  a single-flight claim (SET NX PX, an owner token);
                                        taken by the exact lookup's own script on a miss
                                        (`get_or_claim`: one round trip, not two)
    qg:cache:{T}:lease:<key>:void:<token>   a lookup-and-claim whose reply never came, given
                                        up (`abandon`): deleted its claim, or voids it if late

Writes and evictions are one script each, so a reader never sees an entry half-written or a
cap that another replica's write has just passed. A write prunes up to 64 expired entries and
evicts at most 256 entries past the cap (a cap lowered a lot shrinks over a few writes instead
of blocking Redis in one script). The tenant's keys expire with their newest entry, so a
tenant that stops writing leaves nothing behind.

Semantic lookup without a scan: random-hyperplane LSH (SimHash) with multi-probe. `bands`
groups of `bits` sign bits of seeded random projections (numpy's RandomState, whose stream is
fixed across versions, so every replica buckets a vector alike). Each entry is a member of one
bucket per band, in the scope's part of the tenant's `lsh` sorted set. A probe reads, in each
band, its own bucket and the `flips` buckets one bit away where its projection is nearest zero
(the bits a near neighbour most likely disagrees on), each with one ZRANGE BYLEX (O(log n + m)),
newest `bucket_limit` members first. The union of those ids is the candidate set: at most
`bands * (1 + flips) * bucket_limit` whatever the tenant holds. Their float16 vectors come back
in the same script and the exact cosine is computed here, best first; then the top `limit`
entries are fetched. Expired candidates are pruned as they are met.

Recall vs candidates: two unit vectors at cosine c share one band's bucket with probability
p = (1 - arccos(c) / pi) ** bits. More bits make buckets smaller (fewer unrelated candidates,
which is what a lookup pays for: ~770 bytes and two Lua calls each) but lower p; more bands
win recall back at the cost of memory (a member per band per entry) and range reads; probing
near buckets wins it back without memory. The per-bucket limit is what bounds the cost, and
what costs recall once buckets overflow: with 16 bands of 12 bits, 24 per bucket and no
probes, recall of the true nearest entry (cosine >= 0.9) fell from 0.98 at 10k entries to
0.79 at 100k, as full buckets dropped older entries. Smaller buckets probed more widely keep
it: the defaults, 12 bands of 16 bits, 3 flips, 12 per bucket (576 candidates at most),
measured 0.994, 0.985 and 0.972 at 1k, 10k and 100k, scoring 5, 41 and 239 candidates.
A miss only costs a recomputed answer. `bench/cache_store_scale.py` measures it; figures in
docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from redis.exceptions import ResponseError

from backends.cache.base import CachedEntry, CorruptEntry, Neighbour, unit_vector
from backends.errors import BackendUnavailable
from backends.redis_client import RedisConnection
from backends.retrieval.base import Vector

log = logging.getLogger(__name__)

PREFIX = "qg:cache:"
LSH_SEED = 20261130  # fixed: every replica must bucket a vector alike
_SAFE_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENTRY_MAGIC = b"QGC1"
_ENTRY_HEADER = struct.Struct(">4sIII")  # magic, then lengths of key, question, payload
_PURGE_PER_WRITE = 64
_EXPIRY_DIGITS = 13  # a vector is stored after its expiry, ms since the epoch, zero-padded
_EVICT_PER_WRITE = 256
# How long a given-up lookup-and-claim's token stays void: past any script of it still on its
# way (a paused server runs what it had received as soon as it resumes).
ABANDON_VOID_S = 30.0

# remove(id): undo everything an entry put in the tenant's keys. KEYS (fixed order):
# 1 seq, 2 keys, 3 ent, 4 vec, 5 meta, 6 ord, 7 exp, 8 lsh. ARGV[1] bands, ARGV[2] the width
# in characters of one band's LSH prefix (scope tag + band + bucket).
_LUA_COMMON = """
local BANDS = tonumber(ARGV[1])
local PWIDTH = tonumber(ARGV[2])
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function remove(id)
  local meta = redis.call('HGET', KEYS[5], id)
  if meta then
    local key
    if string.sub(meta, 1, 1) == 'v' then
      local pos = 2
      for band = 1, BANDS do
        redis.call('ZREM', KEYS[8], string.sub(meta, pos, pos + PWIDTH - 1) .. ':' .. id)
        pos = pos + PWIDTH
      end
      key = string.sub(meta, pos)
    else
      key = string.sub(meta, 2)
    end
    if redis.call('HGET', KEYS[2], key) == id then
      redis.call('HDEL', KEYS[2], key)
    end
  end
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
  redis.call('ZREM', KEYS[7], id)
end
"""

# ARGV: 3 key, 4 entry blob, 5 vector ('' for none), 6 ttl ms, 7 cap, 8.. one LSH prefix per
# band (none without a vector).
_PUT = (
    _LUA_COMMON
    + f"""
local key, blob, vec = ARGV[3], ARGV[4], ARGV[5]
local ttl, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local expired = redis.call('ZRANGE', KEYS[7], '-inf', now, 'BYSCORE', 'LIMIT', 0,
                           {_PURGE_PER_WRITE})
for _, old in ipairs(expired) do remove(old) end
local previous = redis.call('HGET', KEYS[2], key)
if previous then remove(previous) end
local seq = redis.call('INCR', KEYS[1])
local id = string.format('%015d', seq)
-- a counter lost to maxmemory eviction restarts at 1: never reuse a live id
if redis.call('HEXISTS', KEYS[5], id) == 1 then remove(id) end
redis.call('HSET', KEYS[2], key, id)
redis.call('HSET', KEYS[3], id, blob)
local meta = '-' .. key
if #ARGV > 7 then
  -- the expiry rides with the vector, so a lookup reads both in one HMGET
  redis.call('HSET', KEYS[4], id, string.format('%013d', now + ttl) .. vec)
  local prefixes = {{}}
  for band = 1, BANDS do
    local prefix = ARGV[7 + band]
    prefixes[band] = prefix
    redis.call('ZADD', KEYS[8], 0, prefix .. ':' .. id)
  end
  meta = 'v' .. table.concat(prefixes) .. key
end
redis.call('HSET', KEYS[5], id, meta)
redis.call('ZADD', KEYS[6], seq, id)
redis.call('ZADD', KEYS[7], now + ttl, id)
local over = redis.call('ZCARD', KEYS[6]) - cap
if over > 0 then
  local victims = redis.call('ZRANGE', KEYS[6], 0, math.min(over, {_EVICT_PER_WRITE}) - 1)
  for _, victim in ipairs(victims) do remove(victim) end
end
for i = 1, #KEYS do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl == -1 or (pttl >= 0 and pttl < ttl) then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return id
"""
)

# lookup(key): {id, entry blob, vector or ''} or false; an expired or half-lost entry is
# removed and is a miss.
_LOOKUP = (
    _LUA_COMMON
    + """
local function lookup(key)
  local id = redis.call('HGET', KEYS[2], key)
  if not id then return false end
  local expires = redis.call('ZSCORE', KEYS[7], id)
  local blob = redis.call('HGET', KEYS[3], id)
  if not expires or tonumber(expires) <= now_ms() or not blob then
    remove(id)
    return false
  end
  return {id, blob, redis.call('HGET', KEYS[4], id) or ''}
end
"""
)

# ARGV: 3 key. Returns lookup's answer.
_GET = _LOOKUP + "\nreturn lookup(ARGV[3])\n"

# The exact lookup and, on a miss, the single-flight claim: a miss costs one round trip, not
# two. KEYS 1-8 the tenant's, 9 the key's lease, 10 the token's void mark (the same hash tag:
# one slot on a cluster). ARGV: 3 key, 4 owner token, 5 lease ms. Returns lookup's entry, or
# 1 (claimed) or 0 (the claim is another caller's, or this token's caller gave up on it).
_GET_OR_CLAIM = (
    _LOOKUP
    + """
local found = lookup(ARGV[3])
if found then return found end
if redis.call('EXISTS', KEYS[10]) == 1 then return 0 end
if redis.call('SET', KEYS[9], ARGV[4], 'NX', 'PX', ARGV[5]) then return 1 end
return 0
"""
)

# A lookup-and-claim whose reply never came (timed out, cancelled) may have claimed, or may
# still be on its way to the server: the claim is deleted if it is the token's, else the
# token is marked void so that a late script does not claim. KEYS: lease, void mark. ARGV:
# token, how long the mark lasts (ms).
_ABANDON = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 0
"""

# ARGV: 3 members per bucket, 4.. the LSH prefixes to read. Returns a flat {now ms, id,
# vector or '', ...}: each vector carries its expiry; the caller drops and prunes expired ones.
# One HMGET for every candidate (not a call per id: at 100k entries the per-id calls were
# two thirds of the script's time).
_CANDIDATES = (
    _LUA_COMMON
    + """
local limit = tonumber(ARGV[3])
local seen, ids = {}, {}
for i = 4, #ARGV do
  local prefix = ARGV[i]
  -- newest first: ids are zero-padded, so lexical order is insertion order
  local members = redis.call('ZRANGE', KEYS[8], '(' .. prefix .. ';', '[' .. prefix .. ':',
                             'BYLEX', 'REV', 'LIMIT', 0, limit)
  for _, member in ipairs(members) do
    local id = string.sub(member, #prefix + 2)
    if not seen[id] then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
end
local out = {tostring(now_ms())}
if #ids == 0 then return out end
local vectors = redis.call('HMGET', KEYS[4], unpack(ids))
for i = 1, #ids do
  out[#out + 1] = ids[i]
  out[#out + 1] = vectors[i] or ''
end
return out
"""
)

# ARGV: 3.. ids. Returns one {id, blob, vector} per id still live, in order.
_FETCH = (
    _LUA_COMMON
    + """
local now = now_ms()
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local expires = redis.call('ZSCORE', KEYS[7], id)
  local blob = redis.call('HGET', KEYS[3], id)
  if expires and tonumber(expires) > now and blob then
    out[#out + 1] = {id, blob, redis.call('HGET', KEYS[4], id) or ''}
  end
end
return out
"""
)

# ARGV: 3 'key' then 4 the key, or 3 'id' then 4.. ids.
_DELETE = (
    _LUA_COMMON
    + """
if ARGV[3] == 'key' then
  local id = redis.call('HGET', KEYS[2], ARGV[4])
  if id then remove(id) end
  return 1
end
for i = 4, #ARGV do remove(ARGV[i]) end
return 1
"""
)

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


def tenant_tag(tenant: str) -> str:
    """The tenant's hash tag. Configured tenant ids are already safe; anything else (a brace
    would end the tag early and scatter the tenant over slots) is hashed."""
    if _SAFE_TENANT.match(tenant):
        return "{" + tenant + "}"
    return "{x" + hashlib.sha256(tenant.encode()).hexdigest()[:32] + "}"


def tenant_keys(tenant: str) -> list[str]:
    base = f"{PREFIX}{tenant_tag(tenant)}:"
    return [base + name for name in ("seq", "keys", "ent", "vec", "meta", "ord", "exp", "lsh")]


def lease_key(tenant: str, key: str) -> str:
    return f"{PREFIX}{tenant_tag(tenant)}:lease:{key}"


def void_key(tenant: str, key: str, token: str) -> str:
    """Marks a lookup-and-claim's token given up (`abandon`): its script, if late, claims no
    lease. Named by the token, so it never touches another caller's claim."""
    return f"{lease_key(tenant, key)}:void:{token}"


def encode_entry(entry: CachedEntry) -> bytes:
    key, question = entry.key.encode(), entry.question.encode()
    header = _ENTRY_HEADER.pack(_ENTRY_MAGIC, len(key), len(question), len(entry.payload))
    return header + key + question + entry.payload


def decode_entry(blob: bytes, vector: bytes) -> CachedEntry:
    """The stored entry, or ValueError for anything that is not one."""
    if len(blob) < _ENTRY_HEADER.size:
        raise ValueError("entry shorter than its header")
    magic, key_len, question_len, payload_len = _ENTRY_HEADER.unpack_from(blob)
    if magic != _ENTRY_MAGIC:
        raise ValueError("unknown entry format")
    start = _ENTRY_HEADER.size
    if start + key_len + question_len + payload_len != len(blob):
        raise ValueError("entry lengths do not add up")
    key = blob[start : start + key_len].decode()
    question = blob[start + key_len : start + key_len + question_len].decode()
    payload = blob[start + key_len + question_len :]
    return CachedEntry(key, question, payload, decode_vector(vector) if vector else None)


def decode_vector(raw: bytes) -> Vector:
    if not raw or len(raw) % 2:
        raise ValueError("vector bytes are not float16")
    vector = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if not np.all(np.isfinite(vector)):
        raise ValueError("vector is not finite")
    return vector


@lru_cache(maxsize=8)
def _planes(dimension: int, hyperplanes: int) -> npt.NDArray[np.float32]:
    # RandomState, not default_rng: its stream is frozen across numpy versions, and replicas
    # running different numpy builds must agree on every bucket.
    rng = np.random.RandomState(LSH_SEED)
    return rng.standard_normal((hyperplanes, dimension)).astype(np.float32)


class LshScheme:
    """Bucket names for a unit vector: one `scope tag + band + bucket` prefix per band."""

    def __init__(self, bands: int, bits: int) -> None:
        if not 1 <= bands <= 255 or not 1 <= bits <= 32:
            raise ValueError("LSH needs 1-255 bands of 1-32 bits")
        self.bands, self.bits = bands, bits
        self._bucket_width = (bits + 3) // 4
        self._weights = (1 << np.arange(bits, dtype=np.uint64)).astype(np.uint64)
        # 16 (scope tag) + 2 (band) + the bucket's hex digits
        self.prefix_width = 16 + 2 + self._bucket_width

    def scope_tag(self, scope: str, dimension: int) -> str:
        """Scope and scheme in 16 hex characters: a change of bands, bits or dimension reads
        other buckets, never ones bucketed another way."""
        raw = f"{scope}\x00{self.bands}:{self.bits}:{dimension}:{LSH_SEED}".encode()
        return hashlib.sha256(raw).hexdigest()[:16]

    def prefixes(self, scope: str, unit: Vector) -> list[str]:
        """The vector's own bucket in each band (where `put` files it)."""
        return self.probe_prefixes(scope, unit, flips=0)

    def probe_prefixes(self, scope: str, unit: Vector, flips: int) -> list[str]:
        """Its own bucket in each band, then, per band, the `flips` buckets one bit away
        where that bit is the least certain (the projection nearest zero): a near neighbour
        that disagrees in a band mostly disagrees there (multi-probe LSH)."""
        tag = self.scope_tag(scope, unit.shape[0])
        projections = (_planes(unit.shape[0], self.bands * self.bits) @ unit).reshape(
            self.bands, self.bits
        )
        buckets = (projections > 0).astype(np.uint64) @ self._weights
        width = self._bucket_width
        found: list[str] = []
        for band, (bucket, row) in enumerate(zip(buckets, projections, strict=True)):
            base = int(bucket)
            found.append(f"{tag}{band:02x}{base:0{width}x}")
            for bit in np.argsort(np.abs(row), kind="stable")[:flips]:
                found.append(f"{tag}{band:02x}{base ^ (1 << int(bit)):0{width}x}")
        return found


class RedisCacheStore:
    """The `CacheStore` protocol on Redis (see the module docstring for the layout)."""

    name = "redis"

    def __init__(
        self,
        connection: RedisConnection,
        max_entries: int | None = None,
        *,
        bands: int = 12,
        bits: int = 16,
        bucket_limit: int = 12,
        flips: int = 3,
    ) -> None:
        self._connection = connection
        # A per-tenant ceiling of the store's own (`cache.max_entries` at start; the smaller
        # of it and a put's wins), as the memory store does.
        self._ceiling = max_entries
        self._lsh = LshScheme(bands, bits)
        self._bucket_limit = bucket_limit
        self._flips = flips
        self._put = connection.register_script(_PUT)
        self._get = connection.register_script(_GET)
        self._get_or_claim = connection.register_script(_GET_OR_CLAIM)
        self._candidates = connection.register_script(_CANDIDATES)
        self._fetch = connection.register_script(_FETCH)
        self._delete = connection.register_script(_DELETE)
        self._release = connection.register_script(_RELEASE)
        self._renew = connection.register_script(_RENEW)
        self._abandon = connection.register_script(_ABANDON)
        # Our own claims' tokens: a release deletes a lease only if it is still ours, not one
        # another caller took after ours expired (in this process or another).
        self._leases: dict[tuple[str, str], str] = {}
        # Lookup-and-claims whose reply never came, for `abandon`: (tenant, key, token) and
        # when (monotonic); past ABANDON_VOID_S a claim they took has lapsed anyway.
        # Oldest first, so that the lapsed ones go from the front: a pass over all of them
        # at each failure was quadratic in an outage, which fails every lookup.
        self._abandoned: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._closed = False
        # Candidates scored by the last `nearest` (for the scale benchmark and tests).
        self.last_candidates = 0

    @property
    def max_candidates(self) -> int:
        """The bound on one lookup's candidates, whatever the tenant holds."""
        return self._lsh.bands * (1 + self._flips) * self._bucket_limit

    # -- the seam ---------------------------------------------------------------------------

    async def get(self, tenant: str, key: str) -> CachedEntry | None:
        reply = await self._script(self._get, tenant, key)
        if not reply:
            return None
        (entry,) = await self._decode_all(tenant, [reply])
        return entry

    async def nearest(self, tenant: str, scope: str, vector: Vector, limit: int) -> list[Neighbour]:
        unit = unit_vector(vector)
        self.last_candidates = 0
        if unit is None or limit <= 0:
            return []
        prefixes = self._lsh.probe_prefixes(scope, unit, self._flips)
        flat = await self._script(self._candidates, tenant, self._bucket_limit, *prefixes)
        now_ms = _server_ms(flat[0] if flat else None)
        ids, similarities, corrupt, stale = self._score(flat[1:], unit, now_ms)
        self.last_candidates = len(ids) + len(corrupt) + len(stale)
        if corrupt or stale:  # expired ones are pruned as they are met
            await self._remove_ids(tenant, [*corrupt, *stale])
        if corrupt:
            raise CorruptEntry(f"{len(corrupt)} cached vector(s) undecodable; deleted")
        best = np.argsort(-similarities, kind="stable")[:limit]
        if best.size == 0:
            return []
        replies = await self._script(self._fetch, tenant, *(ids[i] for i in best))
        entries = await self._decode_all(tenant, replies)
        by_id = dict(zip((_text(r[0]) for r in replies), entries, strict=True))
        similarity = {ids[i]: float(similarities[i]) for i in best}
        return [Neighbour(by_id[i], similarity[i]) for i in (ids[j] for j in best) if i in by_id]

    async def put(
        self, tenant: str, scope: str, entry: CachedEntry, *, ttl_s: int, max_entries: int
    ) -> None:
        cap = max_entries if self._ceiling is None else min(max_entries, self._ceiling)
        unit = None if entry.vector is None else unit_vector(entry.vector)
        vector = b"" if unit is None else unit.astype("<f2").tobytes()
        prefixes = [] if unit is None else self._lsh.prefixes(scope, unit)
        ttl_ms = max(1, int(ttl_s * 1000))
        await self._script(
            self._put, tenant, entry.key, encode_entry(entry), vector, ttl_ms, max(1, cap),
            *prefixes,
        )  # fmt: skip

    async def delete(self, tenant: str, key: str) -> None:
        await self._script(self._delete, tenant, "key", key)

    async def get_or_claim(
        self, tenant: str, key: str, ttl_s: float
    ) -> tuple[CachedEntry | None, bool]:
        token = secrets.token_hex(16)
        ttl_ms = max(1, int(ttl_s * 1000))
        leases = (lease_key(tenant, key), void_key(tenant, key, token))
        try:
            reply = await self._script(self._get_or_claim, tenant, key, token, ttl_ms, extra=leases)
        except BaseException:
            # The server may have run it (a lost reply, a cancelled request): a claim nobody
            # holds would make every process wait out its lease for this key. `abandon`.
            now = time.monotonic()
            while self._abandoned and now - next(iter(self._abandoned.values())) >= ABANDON_VOID_S:
                self._abandoned.popitem(last=False)
            self._abandoned[(tenant, key, token)] = now
            raise
        if isinstance(reply, list):
            (entry,) = await self._decode_all(tenant, [reply])
            return entry, False
        if reply == 1:
            self._leases[(tenant, key)] = token
            return None, True
        if reply == 0:
            return None, False
        raise BackendUnavailable("redis", f"the lookup script answered {reply!r:.40}")

    async def abandon(self, tenant: str, key: str) -> None:
        self._check_open()
        for token in [t for (te, k, t) in self._abandoned if (te, k) == (tenant, key)]:
            keys = [lease_key(tenant, key), void_key(tenant, key, token)]
            void_ms = max(1, int(ABANDON_VOID_S * 1000))
            await self._connection.call(self._abandon(keys=keys, args=[token, void_ms]))
            self._abandoned.pop((tenant, key, token), None)

    async def claim(self, tenant: str, key: str, ttl_s: float) -> bool:
        self._check_open()
        token = secrets.token_hex(16)
        lease = lease_key(tenant, key)
        ttl_ms = max(1, int(ttl_s * 1000))
        taken = await self._connection.call(
            self._connection.client.set(lease, token, nx=True, px=ttl_ms)
        )
        if taken:
            self._leases[(tenant, key)] = token
        return bool(taken)

    async def renew(self, tenant: str, key: str, ttl_s: float) -> bool:
        self._check_open()
        token = self._leases.get((tenant, key))
        if token is None:
            return False
        ttl_ms = max(1, int(ttl_s * 1000))
        renewed = await self._connection.call(
            self._renew(keys=[lease_key(tenant, key)], args=[token, ttl_ms])
        )
        if not renewed:
            self._leases.pop((tenant, key), None)
        return bool(renewed)

    async def release(self, tenant: str, key: str) -> None:
        self._check_open()
        token = self._leases.pop((tenant, key), None)
        if token is None:
            return  # not ours: never delete another caller's lease
        await self._connection.call(self._release(keys=[lease_key(tenant, key)], args=[token]))

    async def ping(self) -> None:
        self._check_open()
        await self._connection.ping()

    async def aclose(self) -> None:
        """Stops using the borrowed client; its owner closes it. Idempotent."""
        self._closed = True
        self._leases.clear()
        self._abandoned.clear()

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable("redis", "the cache store is closed")

    async def _script(self, script: Any, tenant: str, *args: Any, extra: Sequence[str] = ()) -> Any:
        """Run a script on the tenant's eight keys (and `extra` ones, KEYS[9..], all under the
        tenant's hash tag)."""
        self._check_open()
        keys = tenant_keys(tenant)
        argv = [self._lsh.bands, self._lsh.prefix_width, *args]
        try:
            return await self._connection.call(script(keys=[*keys, *extra], args=argv))
        except BackendUnavailable as exc:
            if _wrong_type(exc):
                await self._reset_tenant(keys)
            raise

    async def _reset_tenant(self, keys: list[str]) -> None:
        """A key of the tenant's cache holds another type (something else wrote it): every
        script on it would fail until it expired, and it may never. The cache is only a
        cache, so the tenant's keys are dropped and the next write starts afresh."""
        log.warning("cache keys of the wrong type; the tenant's cache is reset")
        await self._connection.call(self._connection.client.delete(*keys))

    def _score(
        self, flat: Sequence[Any], unit: Vector, now_ms: int
    ) -> tuple[list[str], npt.NDArray[np.float32], list[str], list[str]]:
        """Exact cosine of each live candidate (ids, scores), then apart: ids whose vector is
        not one (corrupt) and ids expired or left without a vector (to prune). Decoded in one
        numpy call for all: per-row decoding cost ~1 ms a lookup at a hundred candidates."""
        size = _EXPIRY_DIGITS + unit.shape[0] * 2
        ids: list[str] = []
        blobs: list[bytes] = []
        corrupt: list[str] = []
        stale: list[str] = []
        for i in range(0, len(flat) - 1, 2):
            cid, raw = _text(flat[i]), flat[i + 1]
            if not raw:
                stale.append(cid)
            elif not isinstance(raw, bytes) or len(raw) != size:
                corrupt.append(cid)  # another dimension, or not ours at all
            elif not raw[:_EXPIRY_DIGITS].isdigit():
                corrupt.append(cid)
            elif int(raw[:_EXPIRY_DIGITS]) <= now_ms:
                stale.append(cid)
            else:
                ids.append(cid)
                blobs.append(raw[_EXPIRY_DIGITS:])
        if not blobs:
            return ids, np.zeros(0, dtype=np.float32), corrupt, stale
        matrix = np.frombuffer(b"".join(blobs), dtype="<f2").reshape(len(blobs), -1)
        finite = np.isfinite(matrix).all(axis=1)
        if not finite.all():
            corrupt.extend(cid for cid, ok in zip(ids, finite, strict=True) if not ok)
            ids = [cid for cid, ok in zip(ids, finite, strict=True) if ok]
            matrix = matrix[finite]
        scores: npt.NDArray[np.float32] = matrix.astype(np.float32) @ unit
        return ids, scores, corrupt, stale

    async def _decode_all(self, tenant: str, replies: Sequence[Any]) -> list[CachedEntry]:
        """Decode {id, blob, vector} replies; any undecodable one is deleted and raises."""
        entries: list[CachedEntry] = []
        corrupt: list[str] = []
        for reply in replies:
            try:
                entries.append(decode_entry(bytes(reply[1]), _vector_part(bytes(reply[2]))))
            except (ValueError, UnicodeDecodeError, TypeError, IndexError):
                corrupt.append(_text(reply[0]))
        if corrupt:
            await self._remove_ids(tenant, corrupt)
            raise CorruptEntry(f"{len(corrupt)} cached entr(y/ies) undecodable; deleted")
        return entries

    async def _remove_ids(self, tenant: str, ids: Sequence[str]) -> None:
        await self._script(self._delete, tenant, "id", *ids)


def _wrong_type(exc: BackendUnavailable) -> bool:
    cause = exc.__cause__
    return isinstance(cause, ResponseError) and "WRONGTYPE" in str(cause)


def _vector_part(stored: bytes) -> bytes:
    """A stored vector without its expiry prefix (b"" for an entry stored without one)."""
    if not stored:
        return b""
    if len(stored) <= _EXPIRY_DIGITS or not stored[:_EXPIRY_DIGITS].isdigit():
        raise ValueError("stored vector without its expiry")
    return stored[_EXPIRY_DIGITS:]


def _server_ms(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise BackendUnavailable("redis", "the candidate script answered garbage") from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
