"""Embeddings from a remote API through litellm (OpenAI, Azure, Cohere, a local server, ...)."""

from __future__ import annotations

# isort: off
from backends.llm import offline  # noqa: F401  (must run before litellm is imported)

# isort: on
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import litellm
import numpy as np
import openai

from backends.errors import BackendUnavailable, UpstreamError
from backends.retrieval.base import Vector

# OpenAI-compatible servers without auth still need some key for the client to send.
_KEYLESS_PLACEHOLDER = "unused"
_BACKEND = "embeddings"

# No retries inside the SDK: the caller answers 503 with Retry-After rather than holding the
# request through the SDK's backoff. litellm 1.110's OpenAI embedding path reads
# `max_retries or litellm.DEFAULT_MAX_RETRIES`, so an explicit 0 alone still means 2 retries (3
# requests per call against a 503); its Azure path falls back to the same default. It is read
# only on those embedding paths, so setting it changes nothing for chat completions.
litellm.DEFAULT_MAX_RETRIES = 0  # type: ignore[attr-defined]  # not re-exported


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """Which embedding API to call and how (the `embeddings` config's litellm fields)."""

    model: str
    dimension: int
    api_base: str | None
    api_key_env: str | None
    batch_size: int
    timeout_s: float


class LiteLLMEmbedder:
    """The `Embedder` for any model litellm can call; vectors are re-normalised here.

    Providers differ on whether they normalise, and cosine search and the semantic cache
    assume unit rows, so normalising again is cheap insurance.
    """

    def __init__(self, config: RemoteModel) -> None:
        self.model_id = config.model
        self.dimension = config.dimension
        self._config = config
        self._api_key = _resolve_key(config.api_key_env)

    async def embed(self, texts: Sequence[str]) -> Vector:
        batch = self._config.batch_size
        parts = [await self._embed_batch(texts[i : i + batch]) for i in range(0, len(texts), batch)]
        if not parts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.vstack(parts)

    async def _embed_batch(self, texts: Sequence[str]) -> Vector:
        try:
            response = await litellm.aembedding(
                model=self._config.model,
                input=list(texts),
                api_base=self._config.api_base,
                api_key=self._api_key,
                timeout=self._config.timeout_s,
                max_retries=0,  # honoured by other providers; see DEFAULT_MAX_RETRIES above
            )
        except openai.APIStatusError as exc:
            if exc.status_code == 429 or exc.status_code >= 500:
                raise BackendUnavailable(_BACKEND, f"{self.model_id}: {exc.status_code}") from exc
            # The provider refused these inputs: the service is up, and a batch shared with
            # others is retried caller by caller so only the bad input fails.
            raise UpstreamError(_BACKEND, f"{self.model_id}: refused ({exc.status_code})") from exc
        except (openai.APIError, TimeoutError, ConnectionError) as exc:
            raise BackendUnavailable(_BACKEND, f"{self.model_id}: {type(exc).__name__}") from exc
        return self._to_matrix(response.data, len(texts))

    def _to_matrix(self, data: list[Any], expected: int) -> Vector:
        # Rows may arrive out of order; each carries its input index.
        rows = sorted(data, key=lambda row: _field(row, "index"))
        matrix = np.asarray([_field(row, "embedding") for row in rows], dtype=np.float32)
        if matrix.shape != (expected, self.dimension):
            wanted = (expected, self.dimension)
            raise UpstreamError(
                _BACKEND, f"{self.model_id}: got shape {matrix.shape}, expected {wanted}"
            )
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        unit: Vector = matrix / np.maximum(norms, 1e-12)
        return unit

    async def aclose(self) -> None:
        """Nothing to release: litellm's shared HTTP clients are closed by the LLM backend."""


def _field(row: Any, name: str) -> Any:
    # litellm returns plain dicts for some providers and objects for others.
    return row[name] if isinstance(row, dict) else getattr(row, name)


def _resolve_key(env_var: str | None) -> str:
    if env_var is None:
        return _KEYLESS_PLACEHOLDER
    key = os.environ.get(env_var, "")
    if not key:
        # Fail at start-up, not on the first query hours later.
        raise ValueError(f"embeddings: environment variable {env_var} is not set")
    return key
