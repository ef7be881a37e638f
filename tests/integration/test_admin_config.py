"""`GET /admin/config`: the active configuration, for the admin key only, secrets redacted; and
`querygate config check` names the version a gateway serves for the same file. The app in
process; the check is the CLI's own process."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, LogLines, OpenClient, config_path
from tests.fixtures.gateway import ADMIN_KEY, KEYS, run_cli

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}

# Every secret value the app below is configured with, in each form a client accepts it; none
# may appear in the answer, in `config check`'s output or in a reload's answer and log.
SECRETS = (
    "demo-secret-4471",
    "redis-pw-8812",
    "redis-qpw-8813",
    "redis-user-8814",
    "os-pw-5530",
    "base-pw-9917",
    "base-key-9918",
    "osuser",
    "apiuser",
)
# Never called: the model is a FakeLLM.
UPSTREAM = "http://apiuser:base-pw-9917@127.0.0.1:9/v1?api_key=base-key-9918"
# userinfo and query credentials at once: redis-py reads both forms.
REDIS_URL = (
    "redis://default:redis-pw-8812@10.0.0.7:6379/0"
    "?username=redis-user-8814&password=redis-qpw-8813&socket_timeout=1"
)


@pytest.fixture(scope="module")
async def with_secrets(app_client: OpenClient) -> Client:
    tier = {"api_base": UPSTREAM}
    return await app_client(
        llm=FakeLLM(),
        demo_api_key="demo-secret-4471",
        models={
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        cache={"redis_url": REDIS_URL},
        retrieval={"opensearch": {"hosts": ["https://osuser:os-pw-5530@search.internal:9200"]}},
    )


@pytest.fixture(scope="module")
async def plain(app_client: OpenClient) -> Client:
    return await app_client(llm=FakeLLM())


async def get_config(client: Client, key: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with client.get("/admin/config", headers=headers) as resp:
        return resp.status, await resp.text()


async def active(client: Client) -> Any:
    status, text = await get_config(client, ADMIN_KEY)
    assert status == 200, text
    return yaml.safe_load(text)  # JSON is YAML


async def test_no_secret_value_appears_in_the_active_configuration(with_secrets: Client) -> None:
    status, text = await get_config(with_secrets, ADMIN_KEY)
    assert status == 200
    for secret in SECRETS:
        assert secret not in text, secret
    config = (await active(with_secrets))["config"]
    assert config["demo_api_key"] == "**********"
    # the server a URL names is still there to read, only its user and password are not
    assert config["cache"]["redis_url"] == (
        "redis://**********@10.0.0.7:6379/0"
        "?username=**********&password=**********&socket_timeout=1"
    )
    assert config["retrieval"]["opensearch"]["hosts"] == ["https://**********@search.internal:9200"]
    assert config["models"]["small"]["api_base"].startswith("http://**********@127.0.0.1:")


async def test_the_configuration_is_the_one_serving_with_its_version(with_secrets: Client) -> None:
    body = await active(with_secrets)
    async with with_secrets.get("/readyz") as resp:
        readyz = await resp.json()
    assert body["config_version"] == readyz["config_version"]
    assert [t["id"] for t in body["config"]["tenants"]] == ["acme", "globex"]
    # key digests are how keys are configured, not keys: shown
    assert len(body["config"]["tenants"][0]["api_key_sha256"][0]) == 64


async def test_a_tenant_key_or_no_key_gets_no_configuration(plain: Client) -> None:
    assert (await get_config(plain, KEYS["acme"]))[0] == 401
    assert (await get_config(plain, None))[0] == 401
    assert (await get_config(plain, ADMIN_KEY))[0] == 200


async def test_config_check_names_the_version_the_gateway_serves(plain: Client) -> None:
    path = config_path(plain)
    done = run_cli(path, "config", "check", str(path))
    assert done.returncode == 0, done.stderr
    served = (await active(plain))["config_version"]
    assert done.stdout.strip() == f"OK {path}: config version {served}"


async def test_config_check_and_a_reload_show_no_credential(
    with_secrets: Client, gateway_log: LogLines
) -> None:
    path = config_path(with_secrets)
    original = path.read_text()
    done = run_cli(path, "config", "check", str(path))
    assert done.returncode == 0, done.stderr
    # A change of the Redis password alone: seen (the version hashes the secrets' slow
    # digests, not their masked form), and refused since the connection opens at start.
    path.write_text(original.replace("redis-qpw-8813", "redis-qpw-0000"))
    try:
        async with with_secrets.post("/admin/reload", headers=ADMIN) as resp:
            status, body = resp.status, await resp.text()
        changed = run_cli(path, "config", "check", str(path))
    finally:
        path.write_text(original)
    assert status == 422, body
    refused = yaml.safe_load(body)["error"]
    assert refused["type"] == "restart_required"
    assert refused["restart_required"] == ["cache.redis_url"]
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout != done.stdout  # another version
    logged = [line for line in gateway_log.lines if line["msg"].startswith("config reload")]
    assert logged[-1]["restart_required_keys"] == ["cache.redis_url"]
    shown = "\n".join([done.stdout, done.stderr, changed.stdout, changed.stderr, body])
    shown += "\n".join(map(str, logged))
    for secret in (*SECRETS, "redis-qpw-0000"):
        assert secret not in shown, secret
