"""Document-level access over HTTP on the shared backends: the index in a real OpenSearch node
(tests/fixtures/opensearch.py) and the response cache in a real Redis (tests/fixtures/redis.py).
A user never receives a chunk, a citation, a cached answer or an agent passage outside their
groups; the in-process checks on the embedded index are test_document_access_http.py's."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from backends.retrieval.opensearch import OpenSearchRetriever
from gateway.http.appkeys import SERVICES
from tests.fakes.llm import FakeLLM
from tests.fixtures.access import (
    FINANCE,
    HR,
    QUESTION,
    SECRET_CODE,
    agent_or_echo,
    ask,
    cited,
    put_corpus,
    secret_in_environment,
    shown,
    tenants,
)
from tests.fixtures.app import Client, OpenClient

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module", autouse=True)
def secret() -> Iterator[None]:
    with secret_in_environment():
        yield


def opensearch(url: str) -> dict[str, object]:
    return {
        "backend": "opensearch",
        "opensearch": {
            "hosts": [url],
            "alias": f"qg-access-{uuid.uuid4().hex[:8]}",
            "search_timeout_s": 15.0,
            "write_timeout_s": 60.0,
        },
    }


@pytest.fixture(scope="module")
async def on_opensearch(
    app_client: OpenClient, opensearch_url: str
) -> AsyncIterator[tuple[Client, FakeLLM]]:
    llm = FakeLLM(agent_or_echo)
    client = await app_client(
        llm=llm,
        corpora={},
        tenants=tenants(),
        retrieval=opensearch(opensearch_url),
        cache={"backend": "off"},
        router={"escalation": {"enabled": False}},
    )
    await put_corpus(client)
    yield client, llm
    retriever = client.app[SERVICES].retriever
    assert isinstance(retriever, OpenSearchRetriever)
    await retriever.drop_all()


@pytest.mark.parametrize("route", ["lookup", "multihop"])
async def test_on_opensearch_no_passage_outside_the_users_groups_is_shown_or_cited(
    on_opensearch: tuple[Client, FakeLLM], route: str
) -> None:
    client, llm = on_opensearch
    llm.calls.clear()
    hr = await ask(client, HR, route=route, debug=True)
    assert hr["route"] == route
    assert "Performance reviews" in shown(llm) and SECRET_CODE not in shown(llm)
    assert "payroll.md" not in cited(hr)
    if route == "lookup":
        assert cited(hr)
    else:
        runs = [run for step in hr["debug"]["agent"]["steps"] for run in step["tool_calls"]]
        passages = [chunk for run in runs for chunk in run["chunk_ids"]]
        assert passages and not any(p.startswith("payroll.md") for p in passages)
    llm.calls.clear()
    finance = await ask(client, FINANCE, route=route)
    assert SECRET_CODE in shown(llm) and "reviews.md" not in cited(finance)


async def test_on_opensearch_a_user_in_no_group_reads_public_documents_only(
    on_opensearch: tuple[Client, FakeLLM],
) -> None:
    client, llm = on_opensearch
    llm.calls.clear()
    nobody = await ask(client, [], route="lookup")
    assert cited(nobody) == {"handbook.md"}
    assert SECRET_CODE not in shown(llm) and "Performance reviews" not in shown(llm)


@pytest.fixture
async def on_redis(app_client: OpenClient, redis_url: str, fake_upstream: str) -> Client:
    """The cache in Redis, opened as `serve` opens it; the fake upstream's answer cites the
    first source it was shown, so a citation says which documents the answer came from."""
    client = await app_client(
        upstream=fake_upstream,
        corpora={},
        tenants=tenants(),
        cache={"backend": "redis", "redis_url": redis_url},
        router={"escalation": {"enabled": False}},
    )
    await put_corpus(client)
    return client


async def test_in_redis_users_in_other_groups_never_share_a_cached_answer(
    on_redis: Client,
) -> None:
    paraphrase = "What's the payroll freeze code?"
    first = await ask(on_redis, FINANCE, route="lookup")
    assert cited(first) == {"payroll.md"} and first["cache"] == "miss"
    # Another finance user shares it, exact and semantic: the misses below are the scope's.
    assert (await ask(on_redis, FINANCE, route="lookup"))["cache"] == "exact"
    assert (await ask(on_redis, FINANCE, paraphrase, route="lookup"))["cache"] == "semantic"
    # An hr user, by the paraphrase first (the semantic tier), then by the question itself
    # (the exact tier; the semantic one may serve the hr user's own answer by then).
    other = await ask(on_redis, HR, paraphrase, route="lookup")
    assert other["cache"] == "miss" and "payroll.md" not in cited(other)
    other = await ask(on_redis, HR, QUESTION, route="lookup")
    assert other["cache"] != "exact" and "payroll.md" not in cited(other)


async def test_in_redis_concurrent_askers_in_other_groups_never_share_one_flight(
    on_redis: Client,
) -> None:
    """The same new question from both groups at once, a few times: single flight joins a
    request only to one of its own scope, so no hr answer cites the finance document."""
    finance_cited = 0
    for n in range(4):
        question = f"Which payroll freeze code applies in week {n}?"
        askers = (FINANCE, HR, FINANCE, HR)
        answers = await asyncio.gather(
            *(ask(on_redis, groups, question, route="lookup") for groups in askers)
        )
        for groups, answer in zip(askers, answers, strict=True):
            if groups == HR:
                assert "payroll.md" not in cited(answer), answer
            else:
                finance_cited += "payroll.md" in cited(answer)
    assert finance_cited  # the finance answers did come from the finance document
