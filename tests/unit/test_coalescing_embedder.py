import asyncio
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest

from backends.embeddings.coalescing import CoalescingEmbedder
from backends.errors import BackendUnavailable
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


class PoisonEmbedder(SlowCountingEmbedder):
    """Fails any batch holding the text "poison", as a tokenizer fails on one bad input."""

    async def embed(self, texts: Sequence[str]) -> Vector:
        if "poison" in texts:
            self.batches.append(list(texts))
            raise ValueError("cannot tokenize")
        return await super().embed(texts)


async def test_a_bad_item_fails_only_its_own_caller() -> None:
    inner = PoisonEmbedder()
    embedder = CoalescingEmbedder(inner)
    texts = ["a", "bb", "poison", "dddd", "eeeee"]
    results = await asyncio.gather(*(embedder.embed([t]) for t in texts), return_exceptions=True)
    assert isinstance(results[2], ValueError)
    ok = [r for i, r in enumerate(results) if i != 2]
    assert [int(r[0, 0]) for r in ok] == [1, 2, 4, 5]  # type: ignore[index]
    # One coalesced batch failed, then each caller was tried alone.
    assert inner.batches[0] == texts
    assert sorted(len(b) for b in inner.batches[1:]) == [1, 1, 1, 1, 1]


async def test_a_lone_surrogate_is_sanitised_before_it_reaches_the_encoder() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner)
    await asyncio.gather(embedder.embed(["ok\ud800"]), embedder.embed(["fine"]))
    assert inner.batches == [["ok\ufffd", "fine"]]
    for text in inner.batches[0]:
        text.encode("utf-8")  # would raise on a surrogate


async def test_a_dependency_that_is_down_fails_the_batch_without_retrying_each() -> None:
    class Down(SlowCountingEmbedder):
        async def embed(self, texts: Sequence[str]) -> Vector:
            self.batches.append(list(texts))
            raise BackendUnavailable("embeddings", "refused")

    inner = Down()
    embedder = CoalescingEmbedder(inner)
    results = await asyncio.gather(
        *(embedder.embed([f"t{i}"]) for i in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, BackendUnavailable) for r in results)
    assert len(inner.batches) == 1


async def test_bulk_work_is_sliced_and_a_query_goes_before_its_next_slice() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner, bulk_threshold=4, bulk_slice=5)
    bulk = asyncio.ensure_future(embedder.embed([f"chunk{i:02d}" for i in range(23)]))
    await asyncio.sleep(0.001)  # the first slice is running
    query = await embedder.embed(["query"])
    vectors = await bulk
    assert [len(b) for b in inner.batches] == [5, 1, 5, 5, 5, 3]
    assert inner.batches[1] == ["query"] and int(query[0, 1]) == 2
    assert vectors.shape == (23, 2)
    assert [int(v) for v in vectors[:, 0]] == [7] * 23


async def test_bulk_callers_take_turns() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner, bulk_threshold=2, bulk_slice=2)
    big = embedder.embed(["a"] * 8)
    small = embedder.embed(["b"] * 3)
    await asyncio.gather(big, small)
    assert [b[0] for b in inner.batches] == ["a", "b", "a", "b", "a", "a"]


async def test_a_caller_that_has_gone_is_not_embedded() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner, bulk_threshold=2, bulk_slice=2)
    first = asyncio.ensure_future(embedder.embed(["first"]))
    await asyncio.sleep(0.001)  # running; the next two wait
    gone = asyncio.ensure_future(embedder.embed(["gone"]))
    gone_bulk = asyncio.ensure_future(embedder.embed(["x"] * 6))
    await asyncio.sleep(0)
    gone.cancel()
    gone_bulk.cancel()
    await first
    assert await embedder.embed(["after"]) is not None
    assert ["gone"] not in inner.batches
    assert all("x" not in b for b in inner.batches)


async def test_a_steady_query_load_slows_bulk_work_but_never_starves_it() -> None:
    inner = SlowCountingEmbedder()
    embedder = CoalescingEmbedder(inner, bulk_threshold=2, bulk_slice=2, bulk_every=2)
    bulk = asyncio.ensure_future(embedder.embed(["doc"] * 6))
    stop = asyncio.Event()

    async def queries() -> None:
        # a new query every millisecond: some are always waiting when a batch ends
        pending = []
        while not stop.is_set():
            pending.append(asyncio.ensure_future(embedder.embed(["q"])))
            await asyncio.sleep(0.001)
        await asyncio.gather(*pending)

    flood = [asyncio.ensure_future(queries())]
    vectors = await asyncio.wait_for(bulk, timeout=5)
    stop.set()
    await asyncio.gather(*flood)
    assert vectors.shape == (6, 2)
    # after the first slice, never more than two query batches between two bulk slices
    slices = [i for i, b in enumerate(inner.batches) if b[0] == "doc"]
    assert all(b - a <= 3 for a, b in pairwise(slices))
