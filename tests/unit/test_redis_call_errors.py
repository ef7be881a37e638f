"""What `backends.redis_client.guarded` makes of what a redis-py call raises: the one map that
keeps every client failure a `BackendUnavailable` (a request's 500 otherwise)."""

from __future__ import annotations

import pytest

from backends.errors import BackendUnavailable
from backends.redis_client import guarded


async def _send_on_a_closed_stream() -> None:
    # What redis-py 7.4's send raises when a concurrent disconnect (a cluster client dropping
    # the connections of a node that died) took its stream writer away mid-call.
    writer = None
    writer.writelines([b"*1\r\n$4\r\nPING\r\n"])  # type: ignore[attr-defined]


async def test_a_stream_lost_mid_send_is_redis_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="AttributeError"):
        await guarded(_send_on_a_closed_stream(), timeout_s=1.0)
