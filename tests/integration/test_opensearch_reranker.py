"""The OpenSearch reranker's request and its reading of the answer, recorded against the
documented ml-commons predict API (no node here has the ml-commons plugin: docs/reranking.md).

A stand-in HTTP server records what opensearch-py's real client sends and answers with the
response shapes ml-commons documents for a text-similarity model: one `inference_results`
entry per document (a model deployed in the cluster), or one entry holding every output (a
model behind a remote connector, the ml-commons rerank tutorial's). Against the real node,
which has no such plugin, the call fails as the seam says, and the stage keeps the fused order.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from backends.errors import BackendUnavailable, UpstreamError
from backends.rerank.base import RerankRequest
from backends.rerank.config import OpenSearchRerankConfig
from backends.rerank.opensearch import OpenSearchReranker
from backends.retrieval.base import Hit
from backends.retrieval.opensearch import OpenSearchConfig
from backends.retrieval.opensearch.client import open_client
from routers.rerank import RerankCall, RerankConfig, RerankStage, RerankTrace

pytestmark = pytest.mark.asyncio(loop_scope="session")

MODEL_ID = "9Yq2dJQBxLm1rerank01"
PASSAGES = ("Carson City is the capital city of Nevada.", "Washington, D.C. is the capital.")


def similarity(score: float) -> dict[str, Any]:
    return {"name": "similarity", "data_type": "FLOAT32", "shape": [1], "data": [score]}


# ml-commons' answer for a cross-encoder deployed in the cluster: one result per document.
LOCAL_MODEL = {"inference_results": [{"output": [similarity(-4.2)]}, {"output": [similarity(9.1)]}]}
# Its answer for a model behind a remote connector: one result, every document's output in it.
REMOTE_MODEL = {
    "inference_results": [{"output": [similarity(0.05), similarity(0.59)], "status_code": 200}]
}


class Contract:
    """The stand-in node: what it received, and what it answers next."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, Any]] = []
        self.status = 200
        self.answer: Any = LOCAL_MODEL

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((request.method, request.path, await request.json()))
        return web.json_response(self.answer, status=self.status)


@pytest.fixture
async def contract() -> AsyncIterator[tuple[Contract, OpenSearchReranker]]:
    node = Contract()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", node.handle)
    async with TestServer(app) as server:
        client = open_client(OpenSearchConfig(hosts=(str(server.make_url("")),)))
        reranker = OpenSearchReranker(client, OpenSearchRerankConfig(model_id=MODEL_ID))
        try:
            yield node, reranker
        finally:
            await reranker.aclose()


async def test_the_request_is_the_documented_text_similarity_prediction(
    contract: tuple[Contract, OpenSearchReranker],
) -> None:
    node, reranker = contract
    query = "What is the capital of the United States?"
    assert await reranker.scores(RerankRequest("acme", query, PASSAGES)) == [
        pytest.approx(-4.2),
        pytest.approx(9.1),
    ]
    assert node.received == [
        (
            "POST",
            f"/_plugins/_ml/_predict/text_similarity/{MODEL_ID}",
            {"query_text": query, "text_docs": list(PASSAGES)},
        )
    ]


async def test_a_remote_connectors_single_result_is_read_in_order(
    contract: tuple[Contract, OpenSearchReranker],
) -> None:
    node, reranker = contract
    node.answer = REMOTE_MODEL
    scores = await reranker.scores(RerankRequest("acme", "capital", PASSAGES))
    assert scores == [pytest.approx(0.05), pytest.approx(0.59)]


@pytest.mark.parametrize(
    "answer",
    [
        {"inference_results": [{"output": [similarity(1.0)]}]},  # one score for two documents
        {"inference_results": [{"output": [{"name": "similarity", "data": [1.0, 2.0]}]}] * 2},
        {"error": "nothing"},
    ],
)
async def test_an_answer_of_another_shape_is_an_upstream_error(
    contract: tuple[Contract, OpenSearchReranker], answer: Any
) -> None:
    node, reranker = contract
    node.answer = answer
    with pytest.raises(UpstreamError):
        await reranker.scores(RerankRequest("acme", "capital", PASSAGES))


async def test_an_overloaded_node_is_unavailable_and_a_refusal_an_error(
    contract: tuple[Contract, OpenSearchReranker],
) -> None:
    node, reranker = contract
    node.status, node.answer = 503, {"error": "busy"}
    with pytest.raises(BackendUnavailable):
        await reranker.scores(RerankRequest("acme", "capital", PASSAGES))
    node.status, node.answer = 400, {"error": {"reason": "Model not ready yet"}}
    with pytest.raises(UpstreamError, match="400"):
        await reranker.scores(RerankRequest("acme", "capital", PASSAGES))


async def test_a_passed_deadline_sends_nothing(
    contract: tuple[Contract, OpenSearchReranker],
) -> None:
    node, reranker = contract
    with pytest.raises(BackendUnavailable, match="deadline"):
        await reranker.scores(
            RerankRequest("acme", "capital", PASSAGES, deadline=time.monotonic() - 1)
        )
    assert node.received == []


class Traces:
    def __init__(self) -> None:
        self.traces: list[RerankTrace] = []

    def record(self, trace: RerankTrace) -> None:
        self.traces.append(trace)

    def spend(self, usd: float) -> None:
        raise AssertionError("the cluster's model is not paid per call")


async def test_on_the_real_node_without_ml_commons_the_fused_order_stands(
    opensearch_url: str,
) -> None:
    config = RerankConfig(reranker="opensearch", opensearch={"model_id": MODEL_ID}, when="always")
    assert config.opensearch is not None
    client = open_client(OpenSearchConfig(hosts=(opensearch_url,), search_timeout_s=15.0))
    reranker = OpenSearchReranker(client, config.opensearch)
    hits = [Hit(f"d{i}", f"d{i}#0", "", "", text, 1.0 - i / 10) for i, text in enumerate(PASSAGES)]
    traces = Traces()
    try:
        kept = await RerankStage(config, reranker).rerank(
            RerankCall("acme", "capital", hits, 2, "lookup", traces)
        )
    finally:
        await reranker.aclose()
    assert kept == hits
    (trace,) = traces.traces
    assert (trace.decision, trace.reranker) == ("failed", "opensearch")
    # The node says why: no predict handler (no ml-commons), or no such model.
    assert "opensearch error" in trace.detail, json.dumps(trace.detail)
