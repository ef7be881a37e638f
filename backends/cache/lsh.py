"""Random-hyperplane LSH (SimHash) for the cache stores' semantic lookups, without a scan.

A unit vector's signature is the signs of seeded random projections, read in `bands` groups of
`bits` sign bits: one bucket number per band. Both stores file an entry in its bucket of every
band and score only the entries sharing a bucket with the probe, so a lookup's candidates are
bounded by the buckets read, not by how many entries a tenant holds. The projections come from
numpy's RandomState with a fixed seed, whose stream is frozen across numpy versions: every
process and every replica buckets a vector alike, and buckets stored in Redis stay readable.

Recall vs candidates: two unit vectors at cosine c share one band's bucket with probability
p = (1 - arccos(c) / pi) ** bits. More bits make buckets smaller (fewer unrelated candidates,
which is what a lookup pays for) but lower p; more bands win recall back at the cost of memory
(a member per band per entry) and bucket reads; probing the buckets one bit away where the
probe's projection is nearest zero (multi-probe, `LshScheme.probe_prefixes`) wins it back
without memory. A store caps what it keeps or reads of one bucket, which bounds the cost and,
once buckets overflow, is what costs recall; the defaults and their measured recall are in
docs/architecture.md and docs/benchmarks.md. A miss only costs a recomputed answer.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from backends.retrieval.base import Vector

LSH_SEED = 20261130  # fixed: every process and replica must bucket a vector alike


@lru_cache(maxsize=8)
def _planes(dimension: int, hyperplanes: int) -> npt.NDArray[np.float32]:
    # RandomState, not default_rng: its stream is frozen across numpy versions, and replicas
    # running different numpy builds must agree on every bucket.
    rng = np.random.RandomState(LSH_SEED)
    return rng.standard_normal((hyperplanes, dimension)).astype(np.float32)


class LshScheme:
    """Bucket numbers of a unit vector, one per band, and the Redis store's names for them
    (`scope tag + band + bucket` prefixes of its lexical sorted set)."""

    def __init__(self, bands: int, bits: int) -> None:
        if not 1 <= bands <= 255 or not 1 <= bits <= 32:
            raise ValueError("LSH needs 1-255 bands of 1-32 bits")
        self.bands, self.bits = bands, bits
        self._bucket_width = (bits + 3) // 4
        self._weights = (1 << np.arange(bits, dtype=np.uint64)).astype(np.uint64)
        # 16 (scope tag) + 2 (band) + the bucket's hex digits
        self.prefix_width = 16 + 2 + self._bucket_width

    def buckets(self, unit: Vector) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
        """Each band's bucket number (its sign bits, the first the least significant) and
        the projections they are the signs of, one row per band."""
        projections = (_planes(unit.shape[0], self.bands * self.bits) @ unit).reshape(
            self.bands, self.bits
        )
        buckets: npt.NDArray[np.uint64] = (projections > 0).astype(np.uint64) @ self._weights
        return buckets, projections

    def scope_tag(self, scope: str, dimension: int) -> str:
        """Scope and scheme in 16 hex characters: a change of bands, bits or dimension reads
        other buckets, never ones bucketed another way."""
        raw = f"{scope}\x00{self.bands}:{self.bits}:{dimension}:{LSH_SEED}".encode()
        return hashlib.sha256(raw).hexdigest()[:16]

    def prefixes(self, scope: str, unit: Vector) -> list[str]:
        """The vector's own bucket in each band (where a write files it)."""
        return self.probe_prefixes(scope, unit, flips=0)

    def probe_prefixes(self, scope: str, unit: Vector, flips: int) -> list[str]:
        """Its own bucket in each band, then, per band, the `flips` buckets one bit away
        where that bit is the least certain (the projection nearest zero): a near neighbour
        that disagrees in a band mostly disagrees there (multi-probe LSH)."""
        tag = self.scope_tag(scope, unit.shape[0])
        buckets, projections = self.buckets(unit)
        width = self._bucket_width
        found: list[str] = []
        for band, (bucket, row) in enumerate(zip(buckets, projections, strict=True)):
            base = int(bucket)
            found.append(f"{tag}{band:02x}{base:0{width}x}")
            for bit in np.argsort(np.abs(row), kind="stable")[:flips]:
                found.append(f"{tag}{band:02x}{base ^ (1 << int(bit)):0{width}x}")
        return found
