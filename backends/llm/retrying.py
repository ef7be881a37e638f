"""Retrying one upstream call on transient failures, with bounded exponential backoff and jitter.

The one retry loop of every upstream the gateway pays for: the model tiers' calls and the remote
reranker's (`backends.rerank.remote`). What counts as transient is `failures.is_transient`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from backends.llm.failures import is_transient

T = TypeVar("T")


async def retrying(
    attempt: Callable[[], Awaitable[T]], attempts: int, initial_s: float, max_s: float
) -> T:
    """`attempt` until it answers, a failure is not transient, or `attempts` ran out, with
    exponential backoff and jitter between tries (tenacity's `wait_exponential_jitter`
    formula; a loop rather than a tenacity object per call, which cost ~5% of a
    pass-through request's CPU)."""
    for number in range(1, attempts + 1):
        try:
            return await attempt()
        except Exception as exc:
            if number >= attempts or not is_transient(exc):
                raise
        backoff = initial_s * 2 ** (number - 1) + random.uniform(0, initial_s)
        await asyncio.sleep(min(backoff, max_s))
    raise ValueError(f"attempts must be at least 1, not {attempts}")
