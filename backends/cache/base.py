"""The cache-store seam: opaque bytes under keys the gateway builds.

Keys already carry every scope (tenant, route, index generation, config version, model); a
store never interprets them. Stores fail open: errors raise BackendUnavailable and the caller
treats them as a miss, never as a failed request.
"""

from __future__ import annotations

from typing import Protocol


class CacheStore(Protocol):
    name: str

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl_s: int) -> None: ...

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...
