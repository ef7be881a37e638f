import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from backends.embeddings.coalescing import CoalescingEmbedder
from backends.retrieval.base import Vector


class SlowCountingEmbedder:
    """Each text becomes [len(text), batch number]; every call takes a few milliseconds."""

    model_id = "counting"
    dimension = 2

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.batches.append(list(texts))
        await asyncio.sleep(0.005)
        if self.fail:
            raise RuntimeError("encoder broke")
        n = len(self.batches)
        return np.array([[len(t), n] for t in texts], dtype=np.float32)

    async def aclose(self) -> None:
        return None


async def test_concurrent_callers_share_batches_and_get_their_own_rows() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner)
    texts = [["a" * i] for i in range(1, 21)]
    results = await asyncio.gather(*(embedder.embed(t) for t in texts))
    assert [int(r[0, 0]) for r in results] == list(range(1, 21))
    # The batch starts on the next loop turn, by which time all twenty callers have queued.
    assert [len(b) for b in inner.batches] == [20]


async def test_callers_arriving_during_a_batch_go_in_the_next_one() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner)
    first = asyncio.ensure_future(embedder.embed(["first"]))
    await asyncio.sleep(0.001)  # the first batch is now running
    later = await asyncio.gather(*(embedder.embed([f"t{i}"]) for i in range(5)))
    await first
    assert [len(b) for b in inner.batches] == [1, 5]
    assert all(int(r[0, 1]) == 2 for r in later)


async def test_batches_respect_the_size_limit() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner, max_batch=4)
    await asyncio.gather(*(embedder.embed([f"t{i}"]) for i in range(13)))
    assert max(len(b) for b in inner.batches) <= 4


async def test_a_failure_reaches_every_waiter_of_that_batch() -> None:
    embedder = CoalescingEmbedder(SlowCountingEmbedder(fail=True))
    results = await asyncio.gather(
        *(embedder.embed(["x"]) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_an_idle_embedder_recovers_after_a_failure() -> None:
    inner = SlowCountingEmbedder(fail=True)
    embedder = CoalescingEmbedder(inner)
    with pytest.raises(RuntimeError):
        await embedder.embed(["x"])
    inner.fail = False
    assert (await embedder.embed(["abc"]))[0, 0] == 3
