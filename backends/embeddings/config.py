"""Which embedding model the gateway uses, and building it.

The model id goes into cache keys and the dimension into the index, so changing either is a
re-index; validation catches the combinations that could never work before anything starts.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from backends.embeddings.base import Embedder
from backends.sections import SECTION

log = logging.getLogger(__name__)

MINILM_MODEL = "all-MiniLM-L6-v2"
MINILM_DIMENSION = 384


class EmbeddingsConfig(BaseModel):
    """`minilm` runs in-process with no server; `litellm` calls any embedding API it knows."""

    model_config = SECTION

    backend: Literal["minilm", "litellm"] = "minilm"
    model: str = Field(
        default=MINILM_MODEL,
        min_length=1,
        description="litellm model string, e.g. 'openai/text-embedding-3-small'",
    )
    api_base: str | None = None
    api_key_env: str | None = Field(
        default=None, description="name of the environment variable holding the API key"
    )
    dimension: int = Field(default=MINILM_DIMENSION, gt=0, le=8192)
    batch_size: int = Field(default=64, gt=0, le=2048)
    runtime: Literal["auto", "onnx", "numpy"] = Field(
        default="auto",
        description="minilm's forward pass: onnx (onnxruntime, fp32 graph built at setup; "
        "about half the numpy pass's CPU per text), numpy, or auto: onnx when onnxruntime is "
        "installed, else numpy; the runtime in use is logged at start",
    )
    precision: Literal["fp32", "int8"] = Field(
        default="fp32",
        description="onnx runtime: the graph's precision. int8 (MatMul weights quantised per "
        "channel, built at setup) embeds a query in 0.35-0.44x fp32's time at cosine ~0.995 to its "
        "vectors, inside fp32's intervals on every routing and retrieval benchmark "
        "(bench/int8_encoder_eval.py); the model id is the same, so an index built with one "
        "is searched with the other",
    )
    threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="onnx runtime: threads one forward pass may use (a single query's latency "
        "falls with more; batches and bulk ingest get their parallelism from callers)",
    )
    timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _minilm_is_one_model(self) -> EmbeddingsConfig:
        if self.backend == "minilm" and (self.model, self.dimension) != (
            MINILM_MODEL,
            MINILM_DIMENSION,
        ):
            raise ValueError(
                f"backend 'minilm' is {MINILM_MODEL} with dimension {MINILM_DIMENSION}; "
                "use backend 'litellm' for another model"
            )
        return self

    @model_validator(mode="after")
    def _int8_is_an_onnx_graph(self) -> EmbeddingsConfig:
        if self.precision == "int8" and (self.backend != "minilm" or self.runtime == "numpy"):
            raise ValueError(
                "precision int8 is the onnx runtime's graph: use backend 'minilm' with "
                "runtime 'onnx' or 'auto'"
            )
        return self


def build_embedder(config: EmbeddingsConfig) -> Embedder:
    """The configured embedder; the caller owns it and must `aclose` it."""
    if config.backend == "minilm":
        return _build_minilm(config)
    # Imported only when configured: litellm costs ~4 s and ~200 MB to import.
    from backends.embeddings.remote import LiteLLMEmbedder, RemoteModel

    remote = RemoteModel(
        config.model,
        config.dimension,
        config.api_base,
        config.api_key_env,
        config.batch_size,
        config.timeout_s,
    )
    return LiteLLMEmbedder(remote)


def _build_minilm(config: EmbeddingsConfig) -> Embedder:
    from backends.embeddings.minilm import MiniLMEmbedder

    embedder: MiniLMEmbedder
    reason = "configured"
    if config.runtime == "numpy":
        embedder = MiniLMEmbedder(batch_size=config.batch_size)
    else:
        try:
            from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder
        except ImportError as exc:
            if config.runtime == "onnx" or config.precision == "int8":
                raise ValueError(
                    f"embeddings.runtime onnx: onnxruntime cannot be imported ({exc})"
                ) from exc
            # Never silent: a gateway that fell back is ~2-3x slower per query.
            log.warning(
                "onnxruntime is not installed: embedding with numpy (slower); "
                "pip install onnxruntime onnx to use it",
                extra={"error": str(exc)},
            )
            embedder = MiniLMEmbedder(batch_size=config.batch_size)
            reason = "onnxruntime missing"
        else:
            embedder = OnnxMiniLMEmbedder(
                precision=config.precision, batch_size=config.batch_size, threads=config.threads
            )
            reason = f"graph from {embedder.graph_source}"
    log.info(
        "embedding runtime",
        extra={"model": embedder.model_id, "runtime": embedder.runtime, "reason": reason},
    )
    return embedder
