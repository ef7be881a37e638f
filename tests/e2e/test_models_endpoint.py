"""`GET /v1/models`: the model names a client may send, and the chat endpoint agrees."""

from __future__ import annotations

import openai
import requests

from tests.fixtures.gateway import KEYS, GatewayProcess


def models(gw: GatewayProcess, tenant: str = "acme") -> requests.Response:
    return requests.get(f"{gw.url}/v1/models", headers=gw.headers(tenant), timeout=10)


def ids(resp: requests.Response) -> list[str]:
    return [m["id"] for m in resp.json()["data"]]


def test_models_lists_auto_and_every_route_the_deployment_executes(
    gateway: GatewayProcess,
) -> None:
    resp = models(gateway)
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list"
    assert ids(resp) == ["auto", "direct", "lookup", "multihop"]
    assert {m["owned_by"] for m in body["data"]} == {"querygate"}
    assert {m["object"] for m in body["data"]} == {"model"}


def test_a_deployment_without_a_large_model_lists_no_multihop_and_refuses_it(
    extractive: GatewayProcess,
) -> None:
    resp = models(extractive)
    assert resp.status_code == 200
    assert ids(resp) == ["auto", "direct", "lookup"]
    chat = requests.post(
        f"{extractive.url}/v1/chat/completions",
        headers=extractive.headers(),
        json={"model": "multihop", "messages": [{"role": "user", "content": "Acme warranty?"}]},
        timeout=30,
    )
    assert chat.status_code == 404
    assert "'multihop'" in chat.json()["error"]["message"]


def test_a_tenant_that_may_not_force_a_route_is_offered_auto_alone(
    gateway: GatewayProcess,
) -> None:
    resp = models(gateway, tenant="globex")
    assert resp.status_code == 200
    assert ids(resp) == ["auto"]


def test_models_needs_a_tenant_key(gateway: GatewayProcess) -> None:
    assert requests.get(f"{gateway.url}/v1/models", timeout=10).status_code == 401
    bad = {"Authorization": "Bearer not-a-key"}
    assert requests.get(f"{gateway.url}/v1/models", headers=bad, timeout=10).status_code == 401


def test_a_model_not_listed_is_404_on_chat_and_on_retrieve(gateway: GatewayProcess) -> None:
    chat = requests.post(
        f"{gateway.url}/v1/chat/completions",
        headers=gateway.headers(),
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 404
    one = requests.get(f"{gateway.url}/v1/models/gpt-4o", headers=gateway.headers(), timeout=10)
    assert one.status_code == 404


def test_the_openai_client_lists_and_retrieves_the_models(gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["acme"], max_retries=0)
    assert [m.id for m in client.models.list()] == ["auto", "direct", "lookup", "multihop"]
    model = client.models.retrieve("lookup")
    assert (model.id, model.owned_by) == ("lookup", "querygate")
