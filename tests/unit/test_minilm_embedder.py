"""The numpy MiniLM must give sentence-transformers' vectors, off the event loop."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from backends.embeddings.minilm import MiniLMEmbedder

# sentence-transformers' published output for all-MiniLM-L6-v2 (docs, semantic_search example):
# the query "A man is eating pasta." against these corpus sentences.
REFERENCE_SCORES = {
    "A man is eating food.": 0.7035,
    "A man is eating a piece of bread.": 0.5272,
    "A man is riding a horse.": 0.1889,
    "A man is riding a white horse on an enclosed ground.": 0.1047,
    "A cheetah is running behind its prey.": 0.0980,
}


async def test_scores_match_sentence_transformers_reference(minilm: MiniLMEmbedder) -> None:
    query = await minilm.embed(["A man is eating pasta."])
    corpus = await minilm.embed(list(REFERENCE_SCORES))
    scores = corpus @ query[0]
    np.testing.assert_allclose(scores, list(REFERENCE_SCORES.values()), atol=2e-4)


async def test_vectors_are_float32_unit_rows_of_384(minilm: MiniLMEmbedder) -> None:
    vectors = await minilm.embed(["one", "two words", "a somewhat longer third sentence"])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


async def test_paraphrase_is_far_closer_than_unrelated_text(minilm: MiniLMEmbedder) -> None:
    a, b, c = await minilm.embed(
        [
            "How do I reset my password?",
            "What are the steps to change a forgotten login password?",
            "The Danube flows through ten countries.",
        ]
    )
    assert float(a @ b) > 0.6
    assert float(a @ c) < 0.2


async def test_batching_and_padding_do_not_change_a_vector(minilm: MiniLMEmbedder) -> None:
    texts = ["short", "a much longer sentence that forces the short one to be padded " * 5]
    alone = await minilm.embed([texts[0]])
    together = await minilm.embed(texts)
    np.testing.assert_allclose(together[0], alone[0], atol=1e-5)


async def test_result_rows_follow_input_order_across_batches() -> None:
    embedder = MiniLMEmbedder(batch_size=2)
    try:
        texts = [f"sentence number {i} " * (7 - i) for i in range(7)]
        batched = await embedder.embed(texts)
        singles = np.vstack([await embedder.embed([t]) for t in texts])
        np.testing.assert_allclose(batched, singles, atol=1e-5)
    finally:
        await embedder.aclose()


async def test_input_longer_than_256_tokens_is_truncated_not_rejected(
    minilm: MiniLMEmbedder,
) -> None:
    long_text = "token " * 2000
    vectors = await minilm.embed([long_text, "token " * 300])
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-5)


async def test_empty_input_gives_an_empty_matrix(minilm: MiniLMEmbedder) -> None:
    assert (await minilm.embed([])).shape == (0, 384)


async def test_embedding_does_not_block_the_event_loop(minilm: MiniLMEmbedder) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    await minilm.embed(["a paragraph of text to embed " * 20] * 32)
    elapsed = time.perf_counter() - started
    task.cancel()
    # The loop kept turning while the forward pass ran on the worker thread.
    assert ticks >= min(5, int(elapsed / 0.01))


def test_model_id_and_dimension_name_the_model() -> None:
    assert (MiniLMEmbedder.model_id, MiniLMEmbedder.dimension) == ("all-MiniLM-L6-v2", 384)
