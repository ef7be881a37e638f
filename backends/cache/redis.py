"""Redis cache store: entries shared by every replica, plain commands and Lua only.

No module is needed (no RediSearch, no vector sets), so it runs on Redis 7, Valkey and managed
services alike. The client is borrowed from `backends.redis_client.RedisConnection`: this
store never builds or closes one, and every call goes through its timeout and error map, so a
down, slow or garbled Redis is a `BackendUnavailable` within `op_timeout_s`. The keys and the
scripts are `backends.cache.redis_scripts`; the bytes stored, `backends.cache.codec`. A
lookup's every call (its pruning and repairs included) passes the request's `spend` on, so the
request's Redis time budget bounds them all.

Semantic lookup without a scan (`backends.cache.lsh`): each entry is a member of one bucket
per band, in the scope's part of the tenant's `lsh` sorted set. A probe reads, in each band,
its own bucket and the `flips` buckets one bit away where its projection is nearest zero, each
with one ZRANGE BYLEX (O(log n + m)), newest `bucket_limit` members first. The union of those
ids is the candidate set: at most `bands * (1 + flips) * bucket_limit` whatever the tenant
holds. Their float16 vectors come back in the same script and the exact cosine is computed
here, best first; then the top `limit` entries are fetched. Expired candidates are pruned as
they are met. A candidate costs ~770 bytes and its share of two Lua calls; the defaults (12
bands of 16 bits, 3 flips, 12 per bucket: 576 candidates at most) and their recall from 1k to
100k entries are measured by `bench/cache_store_scale.py`, figures in docs/architecture.md.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from redis.exceptions import ResponseError

from backends.cache import redis_scripts as scripts
from backends.cache.base import CachedEntry, CorruptEntry, Neighbour, unit_vector
from backends.cache.codec import (
    decode_entry,
    decode_vector_rows,
    encode_entry,
    encode_vector,
    vector_size,
)
from backends.cache.lsh import LshScheme
from backends.cache.redis_scripts import EXPIRY_DIGITS, lease_key, tenant_keys, void_key
from backends.errors import BackendUnavailable
from backends.redis_client import RedisConnection, RequestSpend
from backends.retrieval.base import Vector

log = logging.getLogger(__name__)

# How long a given-up lookup-and-claim's token stays void: past any script of it still on its
# way (a paused server runs what it had received as soon as it resumes).
ABANDON_VOID_S = 30.0


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
        self._put = connection.register_script(scripts.PUT)
        self._get = connection.register_script(scripts.GET)
        self._get_or_claim = connection.register_script(scripts.GET_OR_CLAIM)
        self._candidates = connection.register_script(scripts.CANDIDATES)
        self._fetch = connection.register_script(scripts.FETCH)
        self._delete = connection.register_script(scripts.DELETE)
        self._release = connection.register_script(scripts.RELEASE)
        self._renew = connection.register_script(scripts.RENEW)
        self._abandon = connection.register_script(scripts.ABANDON)
        # Our own claims' tokens: a release deletes a lease only if it is still ours, not one
        # another caller took after ours expired (in this process or another).
        self._leases: dict[tuple[str, str], str] = {}
        # Lookup-and-claims whose reply never came, for `abandon`: (tenant, key, token) and
        # when (monotonic); past ABANDON_VOID_S a claim they took has lapsed anyway.
        # Oldest first, so that the lapsed ones go from the front: an outage fails every
        # lookup, and a pass over all of them at each failure would be quadratic.
        self._abandoned: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._closed = False
        # Candidates scored by the last `nearest` (for the scale benchmark and tests).
        self.last_candidates = 0

    @property
    def max_candidates(self) -> int:
        """The bound on one lookup's candidates, whatever the tenant holds."""
        return self._lsh.bands * (1 + self._flips) * self._bucket_limit

    # -- the seam ---------------------------------------------------------------------------

    async def get(
        self, tenant: str, key: str, *, spend: RequestSpend | None = None
    ) -> CachedEntry | None:
        reply = await self._script(self._get, tenant, key, spend=spend)
        if not reply:
            return None
        (entry,) = await self._decode_all(tenant, [reply], spend)
        return entry

    async def nearest(
        self,
        tenant: str,
        scope: str,
        vector: Vector,
        limit: int,
        *,
        spend: RequestSpend | None = None,
    ) -> list[Neighbour]:
        unit = unit_vector(vector)
        self.last_candidates = 0
        if unit is None or limit <= 0:
            return []
        prefixes = self._lsh.probe_prefixes(scope, unit, self._flips)
        flat = await self._script(
            self._candidates, tenant, self._bucket_limit, *prefixes, spend=spend
        )
        now_ms = _server_ms(flat[0] if flat else None)
        ids, similarities, corrupt, stale = self._score(flat[1:], unit, now_ms)
        self.last_candidates = len(ids) + len(corrupt) + len(stale)
        if corrupt or stale:  # expired ones are pruned as they are met
            await self._remove_ids(tenant, [*corrupt, *stale], spend)
        if corrupt:
            raise CorruptEntry(f"{len(corrupt)} cached vector(s) undecodable; deleted")
        best = np.argsort(-similarities, kind="stable")[:limit]
        if best.size == 0:
            return []
        replies = await self._script(self._fetch, tenant, *(ids[i] for i in best), spend=spend)
        entries = await self._decode_all(tenant, replies, spend)
        by_id = dict(zip((_text(r[0]) for r in replies), entries, strict=True))
        similarity = {ids[i]: float(similarities[i]) for i in best}
        return [Neighbour(by_id[i], similarity[i]) for i in (ids[j] for j in best) if i in by_id]

    async def put(
        self, tenant: str, scope: str, entry: CachedEntry, *, ttl_s: int, max_entries: int
    ) -> None:
        cap = max_entries if self._ceiling is None else min(max_entries, self._ceiling)
        unit = None if entry.vector is None else unit_vector(entry.vector)
        vector = b"" if unit is None else encode_vector(unit)
        prefixes = [] if unit is None else self._lsh.prefixes(scope, unit)
        ttl_ms = max(1, int(ttl_s * 1000))
        await self._script(
            self._put, tenant, entry.key, encode_entry(entry), vector, ttl_ms, max(1, cap),
            *prefixes,
        )  # fmt: skip

    async def delete(self, tenant: str, key: str, *, spend: RequestSpend | None = None) -> None:
        await self._script(self._delete, tenant, "key", key, spend=spend)

    async def get_or_claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> tuple[CachedEntry | None, bool]:
        token = secrets.token_hex(16)
        ttl_ms = max(1, int(ttl_s * 1000))
        leases = (lease_key(tenant, key), void_key(tenant, key, token))
        try:
            reply = await self._script(
                self._get_or_claim, tenant, key, token, ttl_ms, extra=leases, spend=spend
            )
        except BaseException:
            # The server may have run it (a lost reply, a cancelled request): a claim nobody
            # holds would make every process wait out its lease for this key. `abandon`.
            now = time.monotonic()
            while self._abandoned and now - next(iter(self._abandoned.values())) >= ABANDON_VOID_S:
                self._abandoned.popitem(last=False)
            self._abandoned[(tenant, key, token)] = now
            raise
        if isinstance(reply, list):
            (entry,) = await self._decode_all(tenant, [reply], spend)
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

    async def claim(
        self, tenant: str, key: str, ttl_s: float, *, spend: RequestSpend | None = None
    ) -> bool:
        self._check_open()
        token = secrets.token_hex(16)
        lease = lease_key(tenant, key)
        ttl_ms = max(1, int(ttl_s * 1000))
        taken = await self._connection.call(
            self._connection.client.set(lease, token, nx=True, px=ttl_ms), spend
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

    async def _script(
        self,
        script: Any,
        tenant: str,
        *args: Any,
        extra: Sequence[str] = (),
        spend: RequestSpend | None = None,
    ) -> Any:
        """Run a script on the tenant's eight keys (and `extra` ones, KEYS[9..], all under the
        tenant's hash tag)."""
        self._check_open()
        keys = tenant_keys(tenant)
        argv = [self._lsh.bands, self._lsh.prefix_width, *args]
        try:
            return await self._connection.call(script(keys=[*keys, *extra], args=argv), spend)
        except BackendUnavailable as exc:
            if _wrong_type(exc):
                await self._reset_tenant(keys, spend)
            raise

    async def _reset_tenant(self, keys: list[str], spend: RequestSpend | None) -> None:
        """A key of the tenant's cache holds another type (something else wrote it): every
        script on it would fail until it expired, and it may never. The cache is only a
        cache, so the tenant's keys are dropped and the next write starts afresh."""
        log.warning("cache keys of the wrong type; the tenant's cache is reset")
        await self._connection.call(self._connection.client.delete(*keys), spend)

    def _score(
        self, flat: Sequence[Any], unit: Vector, now_ms: int
    ) -> tuple[list[str], npt.NDArray[np.float32], list[str], list[str]]:
        """Exact cosine of each live candidate (ids, scores), then apart: ids whose vector is
        not one (corrupt) and ids expired or left without a vector (to prune). Decoded in one
        numpy call for all: decoding row by row costs ~1 ms a lookup at a hundred candidates."""
        size = EXPIRY_DIGITS + vector_size(unit.shape[0])
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
            elif not raw[:EXPIRY_DIGITS].isdigit():
                corrupt.append(cid)
            elif int(raw[:EXPIRY_DIGITS]) <= now_ms:
                stale.append(cid)
            else:
                ids.append(cid)
                blobs.append(raw[EXPIRY_DIGITS:])
        if not blobs:
            return ids, np.zeros(0, dtype=np.float32), corrupt, stale
        matrix = decode_vector_rows(blobs)
        finite = np.all(np.isfinite(matrix), axis=1)
        if not finite.all():
            corrupt.extend(cid for cid, ok in zip(ids, finite, strict=True) if not ok)
            ids = [cid for cid, ok in zip(ids, finite, strict=True) if ok]
            matrix = matrix[finite]
        scores: npt.NDArray[np.float32] = matrix.astype(np.float32) @ unit
        return ids, scores, corrupt, stale

    async def _decode_all(
        self, tenant: str, replies: Sequence[Any], spend: RequestSpend | None
    ) -> list[CachedEntry]:
        """Decode {id, blob, vector} replies; any undecodable one is deleted and raises."""
        entries: list[CachedEntry] = []
        corrupt: list[str] = []
        for reply in replies:
            try:
                entries.append(decode_entry(bytes(reply[1]), _vector_part(bytes(reply[2]))))
            except (ValueError, UnicodeDecodeError, TypeError, IndexError):
                corrupt.append(_text(reply[0]))
        if corrupt:
            await self._remove_ids(tenant, corrupt, spend)
            raise CorruptEntry(f"{len(corrupt)} cached entr(y/ies) undecodable; deleted")
        return entries

    async def _remove_ids(
        self, tenant: str, ids: Sequence[str], spend: RequestSpend | None
    ) -> None:
        await self._script(self._delete, tenant, "id", *ids, spend=spend)


def _wrong_type(exc: BackendUnavailable) -> bool:
    cause = exc.__cause__
    return isinstance(cause, ResponseError) and "WRONGTYPE" in str(cause)


def _vector_part(stored: bytes) -> bytes:
    """A stored vector without its expiry prefix (b"" for an entry stored without one)."""
    if not stored:
        return b""
    if len(stored) <= EXPIRY_DIGITS or not stored[:EXPIRY_DIGITS].isdigit():
        raise ValueError("stored vector without its expiry")
    return stored[EXPIRY_DIGITS:]


def _server_ms(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise BackendUnavailable("redis", "the candidate script answered garbage") from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
