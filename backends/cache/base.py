"""The cache-store seam: answers stored per tenant, found by exact key or by nearest vector.

The gateway builds every key and decides what may be stored and served (gateway/
response_cache.py); a store only keeps entries and finds them. Each entry lives in one tenant
and one scope — a digest of everything that could change an answer (requested route, the
tenant's index generation, config, prompt and model versions) — so a new generation or config
retires old entries without a scan: nothing ever looks them up again and their TTL ends them.

Guarantees a store gives:
- an entry's TTL is fixed when it is written; reading it never extends it;
- a tenant holds at most `max_entries` entries; writing past that evicts that tenant's oldest
  entries only, never another tenant's;
- `nearest` costs no more than a bounded candidate set, not a scan of the tenant's entries;
- an entry that cannot be decoded is deleted and never returned (`CorruptEntry` says so);
- errors raise `BackendError` (unavailable, timeout, garbage); callers fail open.

The lookups a request waits for (`get`, `nearest`, `delete`, `claim`, `get_or_claim`) take the
request's `spend`: a remote store bounds them, with every other call made for the request, by
its shared time budget (`backends.redis_client`). None: work no answer waits for. The writes,
renewals, releases and abandons run after the answer, in tasks of their own, and take none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from backends.errors import BackendError
from backends.redis_client import RequestSpend
from backends.retrieval.base import Vector


class CorruptEntry(BackendError):
    """A stored entry could not be decoded; the store has deleted it."""


@dataclass(frozen=True, slots=True)
class CachedEntry:
    key: str  # the exact-tier key: unique within its tenant, already scoped
    # The self-contained question it answers as the guards read it (white space collapsed,
    # case kept: `gateway.cache.keys.display_question`), not the exact key's normalised form.
    question: str
    payload: bytes  # the answer, opaque to the store
    vector: Vector | None = None  # None: findable by exact key only


@dataclass(frozen=True, slots=True)
class Neighbour:
    entry: CachedEntry
    similarity: float  # cosine similarity to the probe vector


class CacheStore(Protocol):
    name: str

    async def get(
        self, tenant: str, key: str, *, spend: RequestSpend | None = None
    ) -> CachedEntry | None:
        """The entry under `key`, or None."""
        ...

    async def nearest(
        self,
        tenant: str,
        scope: str,
        vector: Vector,
        limit: int,
        *,
        spend: RequestSpend | None = None,
    ) -> list[Neighbour]:
        """Up to `limit` entries of the tenant's `scope`, most similar first (approximate:
        a candidate set bounded independently of how many entries the tenant has)."""
        ...

    async def put(
        self, tenant: str, scope: str, entry: CachedEntry, *, ttl_s: int, max_entries: int
    ) -> None: ...

    async def delete(self, tenant: str, key: str, *, spend: RequestSpend | None = None) -> None: ...

    async def claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> bool:
        """Single flight: True for the one caller (across every process sharing the store)
        that should compute `key`'s answer now; the lease ends at `release` or after ttl_s.
        The store remembers the claim's owner token: only this store object's own claim is
        renewed or released."""
        ...

    async def get_or_claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> tuple[CachedEntry | None, bool]:
        """`get`, then on a miss `claim`, in one step (one round trip to a remote store): the
        entry and False (nothing claimed), or None and whether this caller now holds the
        claim."""
        ...

    async def abandon(self, tenant: str, key: str) -> None:
        """Give up this store object's `get_or_claim` calls on `key` that raised (their
        reply never came: they may have claimed, or still claim when they reach the store):
        such a claim is released, or not taken. Nothing to do for a local store."""
        ...

    async def renew(self, tenant: str, key: str, ttl_s: float) -> bool:
        """Extend this store object's own claim to ttl_s from now; False when it is no longer
        held (it expired, and may have been taken by another caller)."""
        ...

    async def release(self, tenant: str, key: str) -> None:
        """End this store object's own claim; never one another caller holds."""
        ...

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...


def unit_vector(vector: Vector) -> Vector | None:
    """`vector` scaled to length 1, flattened; None for a zero or non-finite one."""
    v = np.asarray(vector, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm == 0.0:
        return None
    return v / norm
