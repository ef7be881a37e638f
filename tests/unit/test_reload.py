"""Which configuration changes a reload may apply, and which need a restart (every key's class:
tests/unit/test_live_keys.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.server.live_keys import RESTART_ONLY, changed_keys, restart_only
from gateway.server.reload import fingerprint
from gateway.settings import Settings, hash_api_key

# A remote reranker's settings are there, the reranker the default (local): each rerank case
# changes one thing.
REMOTE = {"model": "cohere/rerank-v3.5", "api_base": "http://rerank:8080"}
BASE: dict[str, Any] = {
    "tenants": [{"id": "acme", "api_key_sha256": hash_api_key("key-a")}],
    "retrieval": {"k": 6, "rerank": {"remote": REMOTE}},
}

# One change per RESTART_ONLY entry, each a fragment merged into BASE.
RESTART_CASES: dict[str, dict[str, Any]] = {
    "server.host": {"server": {"host": "0.0.0.0"}},
    "server.port": {"server": {"port": 9001}},
    "server.max_body_bytes": {"server": {"max_body_bytes": 4096}},
    "server.shutdown_grace_s": {"server": {"shutdown_grace_s": 1}},
    "server.worker_max_pause_s": {"server": {"worker_max_pause_s": 5}},
    "server.reload_poll_s": {"server": {"reload_poll_s": 0}},
    "data_dir": {"data_dir": "/srv/elsewhere"},
    "embeddings": {"embeddings": {"batch_size": 8}},
    "retrieval.backend": {"retrieval": {"backend": "opensearch"}},
    "retrieval.opensearch": {"retrieval": {"opensearch": {"hosts": ["http://search:9200"]}}},
    "cache.backend": {"cache": {"backend": "off"}},
    "cache.max_entries": {"cache": {"max_entries": 10}},
    "cache.memory_max_bytes": {"cache": {"memory_max_bytes": 2 * 1024 * 1024}},
    "cache.redis_url": {"cache": {"redis_url": "redis://cache:6379/1"}},
    "cache.redis_socket_timeout_s": {"cache": {"redis_socket_timeout_s": 1}},
    "cache.redis_connect_timeout_s": {"cache": {"redis_connect_timeout_s": 1}},
    "cache.redis_max_connections": {"cache": {"redis_max_connections": 8}},
    "cache.redis_request_budget_s": {"cache": {"redis_request_budget_s": 1}},
    "quotas": {"quotas": {"backend": "memory"}},
    "models": {"models": {"small": {"model": "openai/gpt-4o-mini"}}},
    "retrieval.rerank.reranker": {
        "retrieval": {"rerank": {"reranker": "remote", "remote": REMOTE}}
    },
    "retrieval.rerank.remote": {
        "retrieval": {"rerank": {"remote": {**REMOTE, "api_base": "http://elsewhere:8080"}}}
    },
    "retrieval.rerank.opensearch": {
        "retrieval": {"rerank": {"remote": REMOTE, "opensearch": {"model_id": "m-1"}}}
    },
    "tracing": {"tracing": {"enabled": True}},
}

LIVE_CASES: dict[str, dict[str, Any]] = {
    "retrieval.k": {"retrieval": {"k": 3}},
    "fusion weights": {"retrieval": {"lexical_weight": 0.5, "dense_weight": 2.0}},
    "fusion": {"retrieval": {"fusion": "rrf"}},
    "cache ttl": {"cache": {"ttl_s": 60}},
    "cache entry cap": {"cache": {"max_entry_bytes": 4096}},
    "the rerank policy": {
        "retrieval": {
            "rerank": {
                "remote": REMOTE,
                "when": "always",
                "max_margin": 0.3,
                "candidates": 10,
                "passage_chars": 256,
                "timeout_s": 0.5,
            }
        }
    },
    "request deadline": {"server": {"request_timeout_s": 5}},
    "tenants": {"tenants": [{"id": "initech", "api_key_sha256": hash_api_key("key-i")}]},
    "admin key": {"admin_api_key_sha256": hash_api_key("admin")},
    "a tenant's limits": {
        "tenants": [
            {
                "id": "initech",
                "api_key_sha256": hash_api_key("key-i"),
                "rate_limit": {"requests_per_s": 2, "burst": 4},
                "daily_budget_usd": 5,
            }
        ]
    },
}


def settings_with(fragment: dict[str, Any]) -> Settings:
    data = dict(BASE)
    for section, value in fragment.items():
        merged = {**data[section], **value} if isinstance(data.get(section), dict) else value
        data[section] = merged
    return Settings(**data)


def refused(active: Settings, new: Settings) -> list[str]:
    return restart_only(changed_keys(active, new))


def test_every_restart_only_entry_has_a_case() -> None:
    assert set(RESTART_CASES) == set(RESTART_ONLY)


@pytest.mark.parametrize("name", sorted(RESTART_CASES))
def test_a_restart_only_change_is_named(name: str) -> None:
    keys = refused(settings_with({}), settings_with(RESTART_CASES[name]))
    assert keys, name
    assert all(key == name or key.startswith(f"{name}.") for key in keys), keys


@pytest.mark.parametrize("name", sorted(LIVE_CASES))
def test_a_live_change_needs_no_restart(name: str) -> None:
    active, new = settings_with({}), settings_with(LIVE_CASES[name])
    assert changed_keys(active, new)
    assert refused(active, new) == []


def test_only_the_restart_only_part_of_a_mixed_change_is_named() -> None:
    new = settings_with({"server": {"port": 9001, "request_timeout_s": 5}, "retrieval": {"k": 3}})
    assert changed_keys(settings_with({}), new) == [
        "server.port",
        "server.request_timeout_s",
        "retrieval.k",
    ]
    assert refused(settings_with({}), new) == ["server.port"]


def test_a_section_set_on_one_side_only_is_named_whole() -> None:
    new = settings_with({"models": {"small": {"model": "openai/gpt-4o-mini"}}})
    assert changed_keys(settings_with({}), new) == ["models.small"]
    assert changed_keys(new, settings_with({})) == ["models.small"]


def test_identical_configurations_differ_nowhere() -> None:
    assert changed_keys(settings_with({}), settings_with({})) == []


def test_fingerprint_sees_a_same_size_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("retrieval: {k: 5}\n")
    before = fingerprint(path)
    path.write_text("retrieval: {k: 4}\n")
    assert fingerprint(path) != before


def test_fingerprint_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert fingerprint(tmp_path / "absent.yaml") is None
