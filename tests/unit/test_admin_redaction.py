"""What /admin/config and the version hide: every credential, in each form the clients accept."""

from __future__ import annotations

import json

import pytest

from backends.credentials import REDACTED, mask, redact_url
from gateway.server.admin import redacted_config
from gateway.settings import Settings, hash_api_key

# Each form a credential reaches a client in, as (URL, what may be shown).
URL_FORMS = {
    "userinfo": ("redis://user:pw-1@cache:6379/0", f"redis://{REDACTED}@cache:6379/0"),
    "password only": ("rediss://:pw-2@cache:6380", f"rediss://{REDACTED}@cache:6380"),
    "token as user": ("http://pw-3@api.example/v1", f"http://{REDACTED}@api.example/v1"),
    "query password": (
        "redis://cache:6379/0?password=pw-4",
        f"redis://cache:6379/0?password={REDACTED}",
    ),
    "query username and password": (
        "rediss://cache:6380/0?username=svc-5&password=pw-5&socket_timeout=1",
        f"rediss://cache:6380/0?username={REDACTED}&password={REDACTED}&socket_timeout=1",
    ),
    "ssl password": (
        "rediss://cache:6380/0?ssl_password=pw-6",
        f"rediss://cache:6380/0?ssl_password={REDACTED}",
    ),
    "unix socket userinfo": (
        "unix://:pw-7@/run/redis.sock?db=2",
        f"unix://{REDACTED}@/run/redis.sock?db=2",
    ),
    "unix socket query": (
        "unix:///run/redis.sock?db=2&password=pw-8",
        f"unix:///run/redis.sock?db=2&password={REDACTED}",
    ),
    "cluster": ("redis+cluster://:pw-9@node:7000", f"redis+cluster://{REDACTED}@node:7000"),
    "api key in a query": (
        "https://llm.example/v1?api-key=pw-10",
        f"https://llm.example/v1?api-key={REDACTED}",
    ),
    "percent-encoded name": (
        "redis://cache:6379?pass%77ord=pw-11",
        f"redis://cache:6379?pass%77ord={REDACTED}",
    ),
}


@pytest.mark.parametrize("form", sorted(URL_FORMS))
def test_each_credential_form_of_a_url_is_replaced_and_the_server_kept(form: str) -> None:
    url, shown = URL_FORMS[form]
    assert redact_url(url) == shown


def test_a_url_without_credentials_is_left_as_it_is() -> None:
    for url in ("redis://127.0.0.1:6379/0", "redis://cache:6379/0?db=1&protocol=3", "http://x"):
        assert redact_url(url) == url


def secret_laden() -> Settings:
    # Every value below holding "pw-" is a credential; the rest may be shown.
    tier = {"model": "openai/m", "api_base": "http://svc:pw-a1@llm.internal/v1?api_key=pw-a2"}
    return Settings.model_validate(
        {
            "demo_api_key": "demo-pw-a3",
            "tenants": [{"id": "acme", "api_key_sha256": hash_api_key("pw-a4")}],
            "cache": {"redis_url": "redis://cache.internal:6379/0?password=pw-a5"},
            "retrieval": {
                "opensearch": {
                    "hosts": ["https://admin:pw-a6@os-1:9200", "https://os-2:9200"],
                },
                "rerank": {"remote": {"model": "cohere/r", "api_base": "https://:pw-a7@rr/v1"}},
            },
            "models": {"small": {**tier, "api_key_env": "SMALL_KEY", "fallbacks": [tier]}},
        }
    )


def test_the_configuration_shows_no_credential_and_keeps_the_servers() -> None:
    config = redacted_config(secret_laden())
    text = json.dumps(config)
    assert "pw-" not in text
    assert config["demo_api_key"] == REDACTED
    assert config["cache"]["redis_url"] == f"redis://cache.internal:6379/0?password={REDACTED}"
    assert config["retrieval"]["opensearch"]["hosts"] == [
        f"https://{REDACTED}@os-1:9200",
        "https://os-2:9200",
    ]
    small = config["models"]["small"]
    assert small["api_base"] == f"http://{REDACTED}@llm.internal/v1?api_key={REDACTED}"
    assert small["fallbacks"][0]["api_base"] == small["api_base"]
    # How keys are configured is shown: a digest, and the name of a variable.
    assert small["api_key_env"] == "SMALL_KEY"
    assert config["tenants"][0]["api_key_sha256"] == [hash_api_key("pw-a4")]


def test_a_field_named_as_a_secret_is_hidden_whatever_its_form() -> None:
    from pydantic import BaseModel

    class Section(BaseModel):
        signing_key: str = "pw-b1"
        hmac_secret: str = "pw-b2"
        api_key_env: str = "NAME_OF_VAR"
        keys_sha256: str = "0" * 64

    masked = mask(Section())
    assert masked.data == {
        "signing_key": REDACTED,
        "hmac_secret": REDACTED,
        "api_key_env": "NAME_OF_VAR",
        "keys_sha256": "0" * 64,
    }
    assert masked.secrets == ("pw-b1", "pw-b2")


def test_the_version_changes_with_a_secret_and_shows_none() -> None:
    base = Settings.model_validate({"cache": {"redis_url": "redis://cache:6379/0"}})
    with_password = Settings.model_validate(
        {"cache": {"redis_url": "redis://cache:6379/0?password=pw-c1"}}
    )
    other_password = Settings.model_validate(
        {"cache": {"redis_url": "redis://cache:6379/0?password=pw-c2"}}
    )
    versions = {base.version, with_password.version, other_password.version}
    assert len(versions) == 3
    assert (
        other_password.version
        == Settings.model_validate(
            {"cache": {"redis_url": "redis://cache:6379/0?password=pw-c2"}}
        ).version
    )
    # The masked dump the version hashes is the same for both passwords: only their slow
    # digests tell them apart.
    assert mask(with_password).data == mask(other_password).data
