"""In-process cache store: an LRU dict with per-entry expiry. The embedded default."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class MemoryCacheStore:
    name = "memory"

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._max_entries = max_entries
        self._clock = clock

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if expires_at <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl_s: int) -> None:
        self._entries[key] = (self._clock() + ttl_s, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        self._entries.clear()
