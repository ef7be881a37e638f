"""LiteLLMEmbedder against the fake OpenAI-compatible upstream, and the embeddings config."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from pydantic import ValidationError

from backends.embeddings.config import EmbeddingsConfig, build_embedder
from backends.embeddings.minilm import MiniLMEmbedder
from backends.errors import BackendUnavailable, UpstreamError
from tests.fixtures.upstream import calls_for


def remote_config(api_base: str, **overrides: object) -> EmbeddingsConfig:
    fields: dict[str, object] = {
        "backend": "litellm",
        "model": "openai/fake-embed",
        "api_base": api_base,
        "dimension": 384,
    }
    return EmbeddingsConfig.model_validate(fields | overrides)


async def test_rows_are_unit_vectors_in_input_order_across_batches(fake_upstream: str) -> None:
    embedder = build_embedder(remote_config(fake_upstream, batch_size=2))
    texts = ["alpha", "beta", "gamma", "alpha", "delta"]
    vectors = await embedder.embed(texts)
    assert vectors.shape == (5, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vectors[0], vectors[3])
    alone = await embedder.embed(["gamma"])
    np.testing.assert_allclose(vectors[2], alone[0], atol=1e-6)
    assert embedder.model_id == "openai/fake-embed"


async def test_rejected_inputs_are_an_upstream_error_not_an_outage(fake_upstream: str) -> None:
    # so a coalesced batch holding them is retried caller by caller, and only they fail
    embedder = build_embedder(remote_config(fake_upstream))
    with pytest.raises(UpstreamError, match="refused"):
        await embedder.embed(['x [[fake:{"status": 400}]]'])


async def test_an_unavailable_upstream_gets_one_request_per_embed_call(fake_upstream: str) -> None:
    # the SDK inside litellm retries 5xx twice unless told otherwise, and litellm 1.110 turned an
    # explicit max_retries=0 back into 2 on this path
    key = uuid.uuid4().hex
    text = f"x [[fake:{json.dumps({'status': 503, 'key': key})}]]"
    embedder = build_embedder(remote_config(fake_upstream))
    for _ in range(2):
        with pytest.raises(BackendUnavailable):
            await embedder.embed([text])
    assert await calls_for(fake_upstream, key) == 2


async def test_wrong_dimension_is_refused(fake_upstream: str) -> None:
    embedder = build_embedder(remote_config(fake_upstream, dimension=768))
    with pytest.raises(UpstreamError, match="expected"):
        await embedder.embed(["x"])


def test_missing_key_variable_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QG_TEST_EMBED_KEY", raising=False)
    with pytest.raises(ValueError, match="QG_TEST_EMBED_KEY"):
        build_embedder(remote_config("http://127.0.0.1:9", api_key_env="QG_TEST_EMBED_KEY"))


def test_default_config_builds_minilm() -> None:
    assert isinstance(build_embedder(EmbeddingsConfig()), MiniLMEmbedder)


@pytest.mark.parametrize(
    "fields",
    [{"model": "other-model"}, {"dimension": 768}, {"unknown": 1}, {"backend": "torch"}],
)
def test_invalid_config_is_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        EmbeddingsConfig.model_validate(fields)
