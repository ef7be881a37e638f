"""The Redis cache store's keys and the Lua scripts that read and change them.

Every key of a tenant carries the hash tag `{tenant}`, so on Redis Cluster all of a tenant's
keys share one slot and every script declares all the keys it touches (a tenant's cache is a
fixed set of eight keys, plus one lease key per single-flight claim):

    qg:cache:{T}:seq    string  entry ids (INCR), zero-padded so lexical order is age order
    qg:cache:{T}:keys   hash    exact key -> id
    qg:cache:{T}:ent    hash    id -> entry (key, question, payload; `backends.cache.codec`)
    qg:cache:{T}:vec    hash    id -> expiry (13 digits) + unit vector, float16 (768 bytes at 384-d)
    qg:cache:{T}:meta   hash    id -> what removing it must undo (LSH members, exact key)
    qg:cache:{T}:ord    zset    id by insertion order: the per-tenant cap evicts the oldest
    qg:cache:{T}:exp    zset    id by expiry (ms, server clock): fixed at write, never moved
    qg:cache:{T}:lsh    zset    LSH bucket members, lexical: scope|band|bucket:id
    qg:cache:{T}:lease:<key>    string  a single-flight claim (SET NX PX, an owner token);
                                        taken by the exact lookup's own script on a miss
                                        (`GET_OR_CLAIM`: one round trip, not two)
    qg:cache:{T}:lease:<key>:void:<token>   a lookup-and-claim whose reply never came, given
                                        up (`ABANDON`): deleted its claim, or voids it if late

Writes and evictions are one script each, so a reader never sees an entry half-written or a
cap that another replica's write has just passed. A write prunes up to 64 expired entries and
evicts at most 256 entries past the cap (a cap lowered a lot shrinks over a few writes instead
of blocking Redis in one script). The tenant's keys expire with their newest entry, so a
tenant that stops writing leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "qg:cache:"
_SAFE_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PURGE_PER_WRITE = 64
EXPIRY_DIGITS = 13  # a vector is stored after its expiry, ms since the epoch, zero-padded
_EVICT_PER_WRITE = 256


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
PUT = (
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
  redis.call('HSET', KEYS[4], id, string.format('%0{EXPIRY_DIGITS}d', now + ttl) .. vec)
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
GET = _LOOKUP + "\nreturn lookup(ARGV[3])\n"

# The exact lookup and, on a miss, the single-flight claim: a miss costs one round trip, not
# two. KEYS 1-8 the tenant's, 9 the key's lease, 10 the token's void mark (the same hash tag:
# one slot on a cluster). ARGV: 3 key, 4 owner token, 5 lease ms. Returns lookup's entry, or
# 1 (claimed) or 0 (the claim is another caller's, or this token's caller gave up on it).
GET_OR_CLAIM = (
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
ABANDON = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 0
"""

# ARGV: 3 members per bucket, 4.. the LSH prefixes to read. Returns a flat {now ms, id,
# vector or '', ...}: each vector carries its expiry; the caller drops and prunes expired ones.
# One HMGET for every candidate, not a call per id: at 100k entries per-id calls would be most
# of the script's time.
CANDIDATES = (
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
FETCH = (
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
DELETE = (
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

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
