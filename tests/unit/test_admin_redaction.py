"""What /admin/config hides: every secret value and every URL's user and password."""

from __future__ import annotations

import json

from gateway.server.admin import REDACTED, redact_url, redacted_config
from gateway.settings import Settings


def test_a_urls_userinfo_is_replaced_and_the_server_it_names_kept() -> None:
    assert redact_url("redis://user:pw@cache:6379/0") == f"redis://{REDACTED}@cache:6379/0"
    assert redact_url("rediss://:pw@cache:6380") == f"rediss://{REDACTED}@cache:6380"
    assert redact_url("http://token@api.example/v1") == f"http://{REDACTED}@api.example/v1"


def test_a_url_without_userinfo_is_left_as_it_is() -> None:
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_the_configuration_shows_no_secret_value_and_keeps_the_servers() -> None:
    settings = Settings.model_validate(
        {
            "demo_api_key": "demo-key-123",
            "cache": {"redis_url": "redis://u:cache-pw-9@10.1.2.3:6379/0"},
            "retrieval": {"opensearch": {"hosts": ["https://admin:os-pw-7@os:9200"]}},
        }
    )
    config = redacted_config(settings)
    text = json.dumps(config)
    for secret in ("demo-key-123", "cache-pw-9", "os-pw-7", "admin:"):
        assert secret not in text
    assert config["demo_api_key"] == REDACTED
    assert config["cache"]["redis_url"] == f"redis://{REDACTED}@10.1.2.3:6379/0"
    assert config["retrieval"]["opensearch"]["hosts"] == [f"https://{REDACTED}@os:9200"]
