"""The OpenSearch reranker: a cross-encoder deployed in the cluster's ml-commons plugin.

The gateway fuses BM25 and k-NN itself (`backends.retrieval.base.fuse`, one `_msearch`), so the
list to rerank exists only here, after fusion: a `rerank` search response processor would
rerank one arm's hits, not the fused list. This sends the fused candidates to the same model
the processor calls (its `ml_opensearch` type calls ml-commons' text-similarity prediction with
the query and each hit's text) with ml-commons' predict API:

    POST /_plugins/_ml/_predict/text_similarity/<model_id>
    {"query_text": "...", "text_docs": ["...", ...]}

and reads one `similarity` output per document, in order (a model deployed in the cluster
answers one `inference_results` entry per document; one behind a remote connector one entry
holding every output: both are read as the flat list of outputs). docs/reranking.md has the
contract and how the model is registered and deployed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opensearchpy import AsyncOpenSearch

from backends.errors import BackendUnavailable, UpstreamError
from backends.rerank.base import RerankerKind, RerankRequest
from backends.rerank.config import OpenSearchRerankConfig
from backends.retrieval.opensearch.client import translated

Json = dict[str, Any]


def predict_path(model_id: str) -> str:
    return f"/_plugins/_ml/_predict/text_similarity/{model_id}"


def predict_body(query: str, passages: Sequence[str]) -> Json:
    return {"query_text": query, "text_docs": list(passages)}


def similarities(response: Any, expected: int, model_id: str) -> list[float]:
    """The documents' scores, in order, from a predict response."""
    results = response.get("inference_results") if isinstance(response, Mapping) else None
    if not isinstance(results, list):
        raise UpstreamError("opensearch", f"rerank {model_id}: no inference_results")
    outputs = [
        output
        for result in results
        if isinstance(result, Mapping) and isinstance(result.get("output"), list)
        for output in result["output"]
    ]
    scores = [_similarity(output) for output in outputs]
    if len(scores) != expected or any(s is None for s in scores):
        raise UpstreamError(
            "opensearch", f"rerank {model_id}: expected {expected} similarity outputs"
        )
    return [s for s in scores if s is not None]


def _similarity(output: Any) -> float | None:
    data = output.get("data") if isinstance(output, Mapping) else None
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], int | float):
        return None
    value = float(data[0])
    return value if math.isfinite(value) else None


class OpenSearchReranker:
    kind: RerankerKind = "opensearch"

    def __init__(self, client: AsyncOpenSearch, config: OpenSearchRerankConfig) -> None:
        self.model_id = config.model_id
        self._client = client
        self._config = config

    async def scores(self, request: RerankRequest) -> list[float]:
        if not request.passages:
            return []
        timeout = self._config.timeout_s
        if request.deadline is not None:
            timeout = min(timeout, request.deadline - time.monotonic())
            if timeout <= 0:
                raise BackendUnavailable("opensearch", "rerank: the deadline has passed")
        try:
            with translated(f"rerank {self.model_id}"):
                async with asyncio.timeout(timeout):
                    response = await self._client.transport.perform_request(
                        "POST",
                        predict_path(self.model_id),
                        body=predict_body(request.query, request.passages),
                        timeout=timeout,
                    )
        except TimeoutError as exc:
            raise BackendUnavailable("opensearch", f"rerank {self.model_id}: timed out") from exc
        return similarities(response, len(request.passages), self.model_id)

    async def aclose(self) -> None:
        await self._client.close()
