"""Document-level access over HTTP, in process (`app_client`, the embedded index): documents
PUT with access lists, queries for users whose groups a signed `X-Querygate-User` vouches for.
A user never receives a chunk, a citation, a cached answer, an agent passage or a full-context
passage outside their groups; a query without a valid assertion is a 401, never unfiltered.

The same checks on OpenSearch and with the cache in Redis are in
test_document_access_backends.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from backends.llm.base import Completion, ToolCall, Usage
from tests.fakes.llm import Call, FakeLLM
from tests.fixtures.access import (
    FINANCE,
    HR,
    QUESTION,
    SECRET,
    SECRET_CODE,
    SECRET_ENV,
    agent_or_echo,
    ask,
    cited,
    mint,
    put_corpus,
    secret_in_environment,
    shown,
    tenants,
    user,
)
from tests.fixtures.app import Client, OpenClient, auth, config_path
from tests.fixtures.gateway import ADMIN_KEY

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module", autouse=True)
def secret() -> Iterator[None]:
    with secret_in_environment():
        yield


@pytest.fixture(scope="module")
async def extractive(app_client: OpenClient) -> Client:
    """No model: answers quote their passages verbatim, so a passage shows in the answer."""
    client = await app_client(corpora={}, tenants=tenants())
    await put_corpus(client)
    return client


# -- writes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "why"),
    [
        ("finance", "must be a list"),
        ([], "at least one group"),
        ([f"g{i}" for i in range(65)], "more than 64"),
        ([""], "empty"),
        (["x" * 129], "longer than 128"),
        (["fin\u0007ance"], "control"),
        ([3], "must be a string"),
    ],
)
async def test_a_bad_access_list_is_refused_naming_the_field(
    extractive: Client, groups: object, why: str
) -> None:
    body = {"text": "A document.", "groups": groups}
    resp = await extractive.put("/v1/documents/bad.md", json=body, headers=auth())
    assert resp.status == 422
    error = (await resp.json())["error"]
    assert error["type"] == "validation_error"
    assert error["message"].startswith("groups") and why in error["message"]
    assert (await extractive.delete("/v1/documents/bad.md", headers=auth())).status == 404


async def test_changing_only_the_access_list_writes_the_document_again(
    extractive: Client,
) -> None:
    body = {"text": "The canteen menu changes on Mondays."}
    assert (await extractive.put("/v1/documents/menu.md", json=body, headers=auth())).status == 201
    again = await extractive.put("/v1/documents/menu.md", json=body, headers=auth())
    assert (await again.json())["result"] == "unchanged"
    moved = await extractive.put(
        "/v1/documents/menu.md", json={**body, "groups": ["hr"]}, headers=auth()
    )
    assert (await moved.json())["result"] == "updated"
    answer = await ask(extractive, FINANCE, "When does the canteen menu change?", route="lookup")
    assert "menu.md" not in cited(answer)
    assert "menu.md" in cited(await ask(extractive, HR, "When does the canteen menu change?"))
    assert (await extractive.delete("/v1/documents/menu.md", headers=auth())).status == 200


# -- the assertion ------------------------------------------------------------------------


async def _status(client: Client, headers: dict[str, str], tenant: str = "acme") -> int:
    resp = await client.post("/v1/query", json={"query": QUESTION}, headers=headers)
    body = await resp.json()
    if resp.status == 401:
        assert body["error"]["type"] == "unauthorized"
        assert SECRET not in body["error"]["message"]
    return resp.status


async def test_a_query_without_a_valid_assertion_is_refused(extractive: Client) -> None:
    forged = mint({"groups": FINANCE, "exp": 4_000_000_000}, secret="x" * 40)
    expired = mint({"groups": FINANCE, "exp": 1_000_000})
    assert await _status(extractive, auth()) == 401  # required for acme
    assert await _status(extractive, {**auth(), "X-Querygate-User": forged}) == 401
    assert await _status(extractive, {**auth(), "X-Querygate-User": expired}) == 401
    assert await _status(extractive, {**auth(), "X-Querygate-User": "not-a-jwt"}) == 401
    # A tenant without access control cannot verify one: never taken as "no filter".
    assert await _status(extractive, {**auth("globex"), **user(FINANCE)}) == 401
    assert await _status(extractive, auth("globex")) == 200


async def test_two_assertions_are_refused(extractive: Client) -> None:
    headers = [*auth().items(), *user(FINANCE).items(), *user(HR).items()]
    resp = await extractive.post("/v1/query", json={"query": QUESTION}, headers=headers)
    assert resp.status == 401


async def test_writes_need_no_assertion(extractive: Client) -> None:
    resp = await extractive.put("/v1/documents/x.md", json={"text": "x y z."}, headers=auth())
    assert resp.status == 201
    assert (await extractive.delete("/v1/documents/x.md", headers=auth())).status == 200


# -- what a user receives -----------------------------------------------------------------


async def test_a_user_is_never_cited_nor_quoted_a_document_outside_their_groups(
    extractive: Client,
) -> None:
    hr = await ask(extractive, HR, route="lookup", debug=True)
    assert cited(hr) <= {"reviews.md", "handbook.md"} and cited(hr)
    assert SECRET_CODE not in hr["answer"]
    finance = await ask(extractive, FINANCE, route="lookup")
    assert "payroll.md" in cited(finance) and SECRET_CODE in finance["answer"]


async def test_users_in_other_groups_never_share_a_cached_answer(extractive: Client) -> None:
    question = "Which code is the payroll freeze code?"
    first = await ask(extractive, FINANCE, question)
    assert SECRET_CODE in first["answer"] and first["cache"] == "miss"
    # Another finance user shares it: the cache works, so the misses below are its scope's.
    again = await ask(extractive, FINANCE, question)
    assert again["cache"] == "exact" and again["answer"] == first["answer"]
    for groups in (HR, [], ["finance-interns"]):
        other = await ask(extractive, groups, question)
        assert other["cache"] == "miss", groups
        assert SECRET_CODE not in other["answer"] and "payroll.md" not in cited(other)


async def test_nor_a_paraphrase_in_the_semantic_tier(extractive: Client) -> None:
    first = await ask(extractive, FINANCE, "Tell me the payroll freeze code.")
    assert SECRET_CODE in first["answer"] and first["cache"] == "miss"
    # A finance user's paraphrase is served it: the semantic tier works.
    same = await ask(extractive, FINANCE, "Tell me the payroll freeze code!")
    assert same["cache"] == "semantic"
    other = await ask(extractive, HR, "Tell me the payroll freeze code!")
    assert other["cache"] == "miss" and SECRET_CODE not in other["answer"]


# -- the agent and full context -------------------------------------------------------------


@pytest.fixture(scope="module")
async def with_model(app_client: OpenClient) -> tuple[Client, FakeLLM]:
    llm = FakeLLM(agent_or_echo)
    client = await app_client(
        llm=llm,
        corpora={},
        tenants=tenants(),
        cache={"backend": "off"},
        router={"full_context": {"enabled": True}, "escalation": {"enabled": False}},
    )
    await put_corpus(client)
    return client, llm


# (the route asked, the route that answers): a corpus this small is read whole when the
# route is the gateway's to choose.
ROUTES = [("lookup", "lookup"), ("multihop", "multihop"), ("auto", "full_context")]


@pytest.mark.parametrize(("asked", "route"), ROUTES)
async def test_no_model_call_is_shown_a_passage_outside_the_users_groups(
    with_model: tuple[Client, FakeLLM], asked: str, route: str
) -> None:
    client, llm = with_model
    llm.calls.clear()
    hr = await ask(client, HR, route=asked, debug=True)
    assert hr["route"] == route
    assert llm.calls and SECRET_CODE not in shown(llm)
    assert "Performance reviews" in shown(llm)  # the hr document was read
    assert "payroll.md" not in cited(hr) and SECRET_CODE not in hr["answer"]
    if route == "multihop":
        passages = [
            chunk
            for step in hr["debug"]["agent"]["steps"]
            for run in step["tool_calls"]
            for chunk in run["chunk_ids"]
        ]
        assert passages and not any(p.startswith("payroll.md") for p in passages)
    llm.calls.clear()
    finance = await ask(client, FINANCE, route=asked)
    assert SECRET_CODE in shown(llm) and "Performance reviews" not in shown(llm)
    assert "reviews.md" not in cited(finance)


async def test_the_agents_read_tool_reads_only_what_the_user_may_read(
    with_model: tuple[Client, FakeLLM],
) -> None:
    """A model that names a document the user may not read is told it is not in the
    conversation's results; nothing of it is read."""
    client, llm = with_model

    def read_hidden(call: Call) -> Completion | str:
        if call.tools and not any(m.role == "tool" for m in call.messages):
            read = ToolCall("r1", "read", {"doc_id": "payroll.md"})
            return Completion("", call.tier, "fake", Usage(10, 5), tool_calls=(read,))
        return agent_or_echo(call)

    llm.handler = read_hidden
    llm.calls.clear()
    try:
        hr = await ask(client, HR, route="multihop", debug=True)
    finally:
        llm.handler = agent_or_echo
    runs = [run for step in hr["debug"]["agent"]["steps"] for run in step["tool_calls"]]
    assert runs[0]["name"] == "read" and runs[0]["status"] == "invalid_arguments"
    assert SECRET_CODE not in shown(llm)


async def test_a_tenant_that_does_not_require_the_assertion_serves_public_documents(
    app_client: OpenClient,
) -> None:
    client = await app_client(corpora={}, tenants=tenants(required=False))
    await put_corpus(client)
    anonymous = await ask(client, None, route="lookup")
    assert cited(anonymous) == {"handbook.md"}
    assert SECRET_CODE not in anonymous["answer"]


# -- configuration ------------------------------------------------------------------------


async def test_a_reload_turns_access_control_on_only_with_its_secret_set(
    app_client: OpenClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The secret is read when a configuration is applied: a reload naming a variable that is
    not set (or a secret too short) is refused and the old configuration keeps serving; one
    that is set applies, and /admin/config names the variable, never the secret."""
    client = await app_client(corpora={})
    path = config_path(client)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    config = yaml.safe_load(path.read_text())
    unset = "QUERYGATE_TEST_UNSET_ASSERTION_SECRET"
    monkeypatch.delenv(unset, raising=False)
    monkeypatch.setenv("QUERYGATE_TEST_SHORT_SECRET", "too-short")
    for variable, why in ((unset, "is not set"), ("QUERYGATE_TEST_SHORT_SECRET", "shorter")):
        config["tenants"][0]["access_control"] = {"secret_env": variable}
        path.write_text(yaml.safe_dump(config))
        resp = await client.post("/admin/reload", headers=admin)
        assert resp.status == 422
        error = (await resp.json())["error"]
        assert (
            "tenants.0.access_control.secret_env (acme)" in error["message"]
            and why in error["message"]
        )
        assert (await _status(client, auth())) == 200  # still the old configuration
    config["tenants"][0]["access_control"] = {"secret_env": SECRET_ENV}
    path.write_text(yaml.safe_dump(config))
    resp = await client.post("/admin/reload", headers=admin)
    assert resp.status == 200, await resp.text()
    assert await _status(client, auth()) == 401
    assert await _status(client, {**auth(), **user(FINANCE)}) == 200
    shown_config = await (await client.get("/admin/config", headers=admin)).text()
    assert SECRET_ENV in shown_config and SECRET not in shown_config
