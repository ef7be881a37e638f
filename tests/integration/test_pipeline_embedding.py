"""The query's embedding is paid only when something reads it: the classifier, retrieval or the
semantic cache. A request that forces the direct route, outside the semantic cache, makes no
embedding call (issue 11: the embedding was ~55% of such a request's CPU)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.cache.memory import MemoryCacheStore
from backends.llm.tiers import LiteLLMTiers
from backends.retrieval.base import Vector
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.core.pipeline import Pipeline
from gateway.core.request import QueryRequest
from gateway.core.result import QueryResult
from gateway.core.services import Services
from gateway.obs.metrics import Metrics
from gateway.settings import Settings, TenantConfig
from routers.classifier import HeuristicClassifier
from routers.policy import RouteNotAllowed
from routers.types import Route
from tests.fixtures.embeddings import unit_vector

pytestmark = pytest.mark.asyncio(loop_scope="session")

ACME = TenantConfig(id="acme", api_key_sha256=("0" * 64,))
NOT_FORCING = TenantConfig(id="globex", api_key_sha256=("1" * 64,), allow_force_route=False)


class CountingEmbedder:
    model_id = "counting"
    dimension = 384

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.calls += 1
        return np.stack([unit_vector(hash(t) % 1000) for t in texts])

    async def aclose(self) -> None:
        return None


Build = Callable[..., tuple[Pipeline, CountingEmbedder]]


@pytest.fixture
async def build(fake_upstream: str, tmp_path: Path) -> AsyncIterator[Build]:
    retriever = EmbeddedRetriever(tmp_path / "index.sqlite3")
    tiers: list[LiteLLMTiers] = []

    def make(**cache: Any) -> tuple[Pipeline, CountingEmbedder]:
        tier = {"api_base": fake_upstream, "retries": 0}
        settings = Settings(
            models={"small": {"model": "openai/fake-small", **tier}},
            cache={"backend": "memory", **cache},
        )
        llm = LiteLLMTiers(settings.models.small, settings.models.large)
        tiers.append(llm)
        embedder = CountingEmbedder()
        services = Services(embedder, retriever, llm, MemoryCacheStore(), Metrics())
        return Pipeline(services, settings, HeuristicClassifier()), embedder

    yield make
    for llm in tiers:
        await llm.aclose()
    await retriever.aclose()


async def ask(
    pipeline: Pipeline, text: str, route: str, tenant: TenantConfig = ACME
) -> QueryResult:
    request = QueryRequest(id=uuid.uuid4().hex, tenant=tenant, query=text, route=route)
    return await pipeline.complete(await pipeline.prepare(request))


async def test_a_forced_direct_route_without_a_cache_embeds_nothing(build: Build) -> None:
    pipeline, embedder = build(backend="off")
    result = await ask(pipeline, "Write one sentence about routers.", "direct")
    assert result.answer.route is Route.DIRECT
    assert result.decision is not None and result.decision.reason == "forced"
    assert embedder.calls == 0
    assert "embed" not in result.timings_ms


async def test_a_forced_direct_route_with_the_semantic_cache_off_embeds_nothing(
    build: Build,
) -> None:
    pipeline, embedder = build(semantic={"enabled": False})
    first = await ask(pipeline, "Write one sentence about switches.", "direct")
    again = await ask(pipeline, "Write one sentence about switches.", "direct")
    assert (first.cache, again.cache) == ("miss", "exact")
    assert embedder.calls == 0


async def test_a_forced_direct_route_under_the_semantic_cache_is_embedded(build: Build) -> None:
    # Its vector is what a later paraphrase is matched against.
    pipeline, embedder = build()
    await ask(pipeline, "Write one sentence about bridges.", "direct")
    assert embedder.calls == 1


async def test_an_auto_route_is_embedded_and_classified(build: Build) -> None:
    pipeline, embedder = build(backend="off")
    result = await ask(pipeline, "Hello there, thanks a lot!", "auto")
    assert embedder.calls == 1
    assert result.decision is not None and result.decision.reason != "forced"


async def test_a_tenant_that_may_not_force_is_still_refused_without_classification(
    build: Build,
) -> None:
    pipeline, embedder = build(backend="off")
    with pytest.raises(RouteNotAllowed):
        await ask(pipeline, "Write one sentence about hubs.", "direct", NOT_FORCING)
    assert embedder.calls == 0
