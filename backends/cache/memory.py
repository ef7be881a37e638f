"""In-process cache store, the embedded default: one process's entries, per tenant.

Exact entries sit in one insertion-ordered dict per tenant, so writing past the tenant's cap
evicts that tenant's oldest entries and no one else's; a read never reorders or extends one
(the TTL is fixed when it is written). The whole store also holds at most `max_bytes` (an
entry's size: its key, question, payload and vector, plus a fixed allowance for what indexes
it): past it, the oldest entries of the tenant holding the most bytes go first, so one tenant
filling the store evicts its own entries, and another's only once that one holds no more.

`nearest` must not scan a tenant's entries. Vectors are bucketed by the random-hyperplane LSH
of `backends.cache.lsh`: `tables` independent tables (its bands) of `bits` sign bits each, one
bucket per (tenant, scope, table, signature), each bucket keeping its newest `bucket_cap` keys.
A probe reads its own bucket in every table, so it scores at most `tables * bucket_cap`
candidates (one matrix product) whatever the tenant holds. Two unit vectors at cosine c fall in
one table's bucket with probability (1 - arccos(c)/pi) ** bits; with the default 16 tables of
12 bits (the Redis store uses 12 bands of 16 bits, probed one bit away), at least one table
shares it with probability 0.995 at c = 0.95 and 0.93 at c = 0.90.
Measured by `python bench/cache_eval.py` (1k to 100k entries in one tenant): a near-duplicate
is rarely missed, and a miss only costs a recomputed answer.

A single-flight claim holds an owner token, as the Redis store's does: `renew` and `release`
touch a claim only while it is still the one this store took, never one taken after it expired.
A closed store fails every call with `BackendUnavailable`, which callers fail open on. A
request's `spend` (its Redis time budget) is taken and not used: nothing here waits on Redis.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from backends.cache.base import CachedEntry, Neighbour, unit_vector
from backends.cache.lsh import LshScheme
from backends.errors import BackendUnavailable
from backends.redis_client import RequestSpend
from backends.retrieval.base import Vector

# What the store counts beside an entry's key, question, payload and unit vector, so that the
# ceiling bounds the memory the store really holds; measured with tracemalloc over one tenant
# and many, and held to that count by tests/unit/test_cache_bounds.py:
# the entry's own objects (their headers, the entry and its record, its slot in the tenant's
# dict),
ENTRY_OVERHEAD_BYTES = 400
# the unit vector's array object,
ARRAY_OVERHEAD_BYTES = 112
# its key's slot in the bucket of each LSH table,
BUCKET_SLOT_BYTES = 8
# and a bucket's own list and its slot in the index, counted while the bucket holds a key.
BUCKET_BYTES = 155


@dataclass(slots=True)
class _Stored:
    scope: str
    entry: CachedEntry  # kept without its raw vector: `unit` is the one the store reads
    expires_at: float
    unit: Vector | None
    size: int


def entry_size(entry: CachedEntry, unit: Vector | None, tables: int) -> int:
    """What the store counts an entry as holding, its buckets' own lists apart."""
    own = len(entry.key.encode()) + len(entry.question.encode()) + len(entry.payload)
    if unit is None:
        return own + ENTRY_OVERHEAD_BYTES
    indexed = unit.nbytes + ARRAY_OVERHEAD_BYTES + tables * BUCKET_SLOT_BYTES
    return own + indexed + ENTRY_OVERHEAD_BYTES


class MemoryCacheStore:
    name = "memory"

    def __init__(
        self,
        max_entries: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_bytes: int | None = None,
        tables: int = 16,
        bits: int = 12,
        bucket_cap: int = 32,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        # A per-tenant ceiling of the store's own (the smaller of it and a put's wins):
        # `cache.max_entries` at start, which a reload cannot change.
        self._ceiling = max_entries
        self._max_bytes = max_bytes  # the whole store's (None: no ceiling)
        self._bytes: dict[str, int] = {}  # per tenant
        self.total_bytes = 0
        # Told the store's counted bytes at every change (the gateway's gauge).
        self._on_bytes = on_bytes
        self._clock = clock
        self._lsh = LshScheme(tables, bits)
        self._bucket_cap = bucket_cap
        self._tenants: dict[str, OrderedDict[str, _Stored]] = {}
        # (tenant, scope) -> bucket number -> its keys, oldest first. Lists, not dicts: most
        # buckets of a small tenant hold one key, and a bucket holds at most `bucket_cap`.
        self._buckets: dict[tuple[str, str], dict[int, list[str]]] = {}
        # (tenant, key) -> (owner token, expiry); `_owned` holds the tokens this store took.
        self._claims: dict[tuple[str, str], tuple[int, float]] = {}
        self._owned: dict[tuple[str, str], int] = {}
        self._tokens = itertools.count(1)
        self._closed = False
        # Candidates scored by the last `nearest` (bench/cache_eval.py --scale reads it).
        self.last_candidates = 0

    # -- the seam ---------------------------------------------------------------------------

    async def get(
        self, tenant: str, key: str, *, spend: RequestSpend | None = None
    ) -> CachedEntry | None:
        self._check_open()
        entries = self._tenants.get(tenant)
        stored = None if entries is None else entries.get(key)
        if stored is None:
            return None
        if stored.expires_at <= self._clock():
            self._remove(tenant, key)
            return None
        return stored.entry

    async def nearest(
        self,
        tenant: str,
        scope: str,
        vector: Vector,
        limit: int,
        *,
        spend: RequestSpend | None = None,
    ) -> list[Neighbour]:
        self._check_open()
        entries = self._tenants.get(tenant)
        if not entries:
            return []
        unit = unit_vector(vector)
        if unit is None:
            return []
        now = self._clock()
        seen: dict[str, None] = {}
        index = self._buckets.get((tenant, scope), {})
        for bucket in self._signature(unit):
            seen.update(dict.fromkeys(index.get(bucket, ())))
        self.last_candidates = len(seen)
        live = [
            stored
            for key in seen
            if (stored := entries.get(key)) is not None
            and stored.unit is not None
            and stored.expires_at > now
        ]
        if not live:
            return []
        similarities = np.stack([s.unit for s in live if s.unit is not None]) @ unit
        best = np.argsort(-similarities)[:limit]
        return [Neighbour(live[i].entry, float(similarities[i])) for i in best]

    async def put(
        self, tenant: str, scope: str, entry: CachedEntry, *, ttl_s: int, max_entries: int
    ) -> None:
        self._check_open()
        self._remove(tenant, entry.key)  # a rewrite is a new entry: newest, TTL from now
        entries = self._tenants.setdefault(tenant, OrderedDict())
        unit = None if entry.vector is None else unit_vector(entry.vector)
        size = entry_size(entry, unit, self._lsh.bands)
        kept = replace(entry, vector=None)
        entries[entry.key] = _Stored(scope, kept, self._clock() + ttl_s, unit, size)
        self._count(tenant, size)
        if unit is not None:
            index = self._buckets.setdefault((tenant, scope), {})
            for bucket in self._signature(unit):
                keys = index.get(bucket)
                if keys is None:
                    keys = index[bucket] = []
                    self._count(tenant, BUCKET_BYTES)
                keys.append(entry.key)
                if len(keys) > self._bucket_cap:
                    del keys[0]
        cap = max_entries if self._ceiling is None else min(max_entries, self._ceiling)
        while len(entries) > cap:
            self._remove(tenant, next(iter(entries)))
        while self._max_bytes is not None and self.total_bytes > self._max_bytes:
            largest = max(self._bytes, key=self._bytes.__getitem__)
            self._remove(largest, next(iter(self._tenants[largest])))

    async def delete(self, tenant: str, key: str, *, spend: RequestSpend | None = None) -> None:
        self._check_open()
        self._remove(tenant, key)

    async def claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> bool:
        self._check_open()
        now = self._clock()
        held = self._claims.get((tenant, key))
        if held is not None and held[1] > now:
            return False
        token = next(self._tokens)
        self._claims[(tenant, key)] = (token, now + ttl_s)
        self._owned[(tenant, key)] = token
        return True

    async def get_or_claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> tuple[CachedEntry | None, bool]:
        entry = await self.get(tenant, key)  # never yields: atomic with the claim
        if entry is not None:
            return entry, False
        return None, await self.claim(tenant, key, ttl_s)

    async def abandon(self, tenant: str, key: str) -> None:
        return None  # get_or_claim never yields: it claimed and said so, or did nothing

    async def renew(self, tenant: str, key: str, ttl_s: float) -> bool:
        self._check_open()
        if not self._holds(tenant, key):
            self._owned.pop((tenant, key), None)
            return False
        self._claims[(tenant, key)] = (self._owned[(tenant, key)], self._clock() + ttl_s)
        return True

    async def release(self, tenant: str, key: str) -> None:
        self._check_open()
        if self._holds(tenant, key):
            del self._claims[(tenant, key)]
        self._owned.pop((tenant, key), None)

    async def ping(self) -> None:
        self._check_open()

    async def aclose(self) -> None:
        self._closed = True
        self._tenants.clear()
        self._bytes.clear()
        self.total_bytes = 0
        if self._on_bytes is not None:
            self._on_bytes(0)
        self._buckets.clear()
        self._claims.clear()
        self._owned.clear()

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable("cache", "the cache store is closed")

    def _holds(self, tenant: str, key: str) -> bool:
        """This store's own claim on the key is still the live one."""
        held = self._claims.get((tenant, key))
        token = self._owned.get((tenant, key))
        return held is not None and held[0] == token and held[1] > self._clock()

    def _remove(self, tenant: str, key: str) -> None:
        entries = self._tenants.get(tenant)
        stored = None if entries is None else entries.pop(key, None)
        if stored is None:
            return
        self._count(tenant, -stored.size)
        if stored.unit is not None:
            self._unindex(tenant, stored.scope, key, stored.unit)
        if entries is not None and not entries:
            del self._tenants[tenant]
            del self._bytes[tenant]

    def _unindex(self, tenant: str, scope: str, key: str, unit: Vector) -> None:
        """Take `key` out of its buckets (found again from its vector, rather than kept: 16
        numbers an entry would cost more than the product that finds them)."""
        index = self._buckets.get((tenant, scope))
        if index is None:
            return
        for bucket in self._signature(unit):
            keys = index.get(bucket)
            if keys is not None and key in keys:
                keys.remove(key)
                if not keys:
                    del index[bucket]
                    self._count(tenant, -BUCKET_BYTES)
        if not index:
            del self._buckets[(tenant, scope)]

    def _count(self, tenant: str, size: int) -> None:
        self._bytes[tenant] = self._bytes.get(tenant, 0) + size
        self.total_bytes += size
        if self._on_bytes is not None:
            self._on_bytes(self.total_bytes)

    def _signature(self, unit: Vector) -> tuple[int, ...]:
        """One bucket number per table, unique across the tables."""
        buckets, _ = self._lsh.buckets(unit)
        return tuple((table << self._lsh.bits) | int(b) for table, b in enumerate(buckets))
