from pathlib import Path

import pytest

from backends.config_yaml import MAX_CONFIG_BYTES
from gateway.settings import ConfigError, hash_api_key, load_settings
from tests.fixtures.yaml_bomb import alias_bomb

KEY_HASH = hash_api_key("secret-a")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file_run_the_embedded_backend() -> None:
    settings = load_settings(None)
    assert settings.retrieval.backend == "embedded"
    assert settings.server.port == 8080
    assert settings.models.small is None


def test_file_values_are_read_and_env_overrides_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "server:\n  port: 9001\n  host: 0.0.0.0\n")
    monkeypatch.setenv("QUERYGATE_SERVER__PORT", "9002")
    settings = load_settings(path)
    assert settings.server.port == 9002
    assert settings.server.host == "0.0.0.0"


def test_invalid_field_is_named_in_the_error(tmp_path: Path) -> None:
    path = write(tmp_path, "retrieval:\n  k: 0\n")
    with pytest.raises(ConfigError, match=r"retrieval\.k"):
        load_settings(path)


def test_unknown_field_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "retreival:\n  k: 3\n")
    with pytest.raises(ConfigError, match="retreival"):
        load_settings(path)


def test_tenant_keys_must_be_sha256_digests(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants:\n  - id: a\n    api_key_sha256: plain-secret\n")
    with pytest.raises(ConfigError, match=r"tenants\.0\.api_key_sha256"):
        load_settings(path)


def test_one_key_cannot_belong_to_two_tenants(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"tenants:\n  - id: a\n    api_key_sha256: {KEY_HASH}\n"
        f"  - id: b\n    api_key_sha256: {KEY_HASH}\n",
    )
    with pytest.raises(ConfigError, match="one tenant only"):
        load_settings(path)


def test_unreadable_yaml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(write(tmp_path, "server: [unclosed"))


def test_version_changes_with_the_configuration(tmp_path: Path) -> None:
    a = load_settings(write(tmp_path, "retrieval:\n  k: 4\n")).version
    b = load_settings(write(tmp_path, "retrieval:\n  k: 5\n")).version
    assert a != b
    assert a == load_settings(write(tmp_path, "retrieval:\n  k: 4\n")).version


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("server:\n  request_timeout_s: .inf\n", r"server\.request_timeout_s"),
        ("agent:\n  deadline_s: .inf\n", r"agent\.deadline_s"),
        ("cache:\n  single_flight_wait_s: .inf\n", r"cache\.single_flight_wait_s"),
        ("server:\n  admission:\n    max_queue_wait_s: .nan\n", r"server\.admission"),
        ("models:\n  small:\n    model: openai/x\n    timeout_s: .inf\n", r"models\.small"),
        ("router:\n  escalation:\n    min_coverage: .nan\n", r"router\.escalation"),
        ("retrieval:\n  opensearch:\n    search_timeout_s: .nan\n", r"retrieval\.opensearch"),
    ],
)
def test_an_infinite_or_nan_number_is_refused_naming_it(
    tmp_path: Path, text: str, field: str
) -> None:
    # An infinite timeout or deadline passed `gt=0` and turned its cut-off off for good.
    with pytest.raises(ConfigError, match=field):
        load_settings(write(tmp_path, text))


@pytest.mark.parametrize(
    "text",
    [
        "models:\n  small:\n    model: ''\n",
        "models:\n  large:\n    model: openai/x\n    fallbacks:\n      - model: ''\n",
        "embeddings:\n  backend: litellm\n  model: ''\n",
    ],
)
def test_an_empty_model_name_is_refused_at_load(tmp_path: Path, text: str) -> None:
    # It was accepted and failed only at the first model call.
    with pytest.raises(ConfigError, match="model"):
        load_settings(write(tmp_path, text))


def test_the_default_drain_outlasts_the_longest_request_the_defaults_allow() -> None:
    # A drain shorter than a request may run cut answers at every rollout (each one a
    # `cancelled` answer against the availability objective).
    server = load_settings(None).server
    assert server.shutdown_grace_s >= server.request_timeout_s


@pytest.mark.parametrize("pause", ["0.5", "601"])
def test_a_worker_pause_outside_1_to_600_s_is_refused(tmp_path: Path, pause: str) -> None:
    # Under 1 s a crash loop spends the cores on model loads; past 10 minutes the supervisor
    # would sit for longer than any orchestrator waits before it gives up.
    with pytest.raises(ConfigError, match="worker_max_pause_s"):
        load_settings(write(tmp_path, f"server:\n  worker_max_pause_s: {pause}\n"))
    assert load_settings(None).server.worker_max_pause_s == 30.0


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    # 10**9 nodes as built; refused from its composed graph of ~100 nodes.
    path = write(tmp_path, f"retrieval:\n  k: 3\n{alias_bomb()}")
    assert path.stat().st_size < 1024
    with pytest.raises(ConfigError, match=r"aliases would repeat 1,\d{3},\d{3},\d{3} nodes"):
        load_settings(path)


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "bomb: &loop [*loop]\n")
    with pytest.raises(ConfigError, match="recursive alias"):
        load_settings(path)


def test_nesting_too_deep_to_compose_is_refused_not_a_crash(tmp_path: Path) -> None:
    path = write(tmp_path, "server: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_settings(path)


def test_a_few_aliases_reusing_a_section_still_load(tmp_path: Path) -> None:
    tier = "{model: openai/fallback, timeout_s: 5}"
    path = write(
        tmp_path,
        f"models:\n  small:\n    model: openai/a\n    fallbacks: [&fb {tier}]\n"
        "  large:\n    model: openai/b\n    fallbacks: [*fb]\n",
    )
    settings = load_settings(path)
    assert settings.models.large is not None and settings.models.small is not None
    assert settings.models.large.fallbacks == settings.models.small.fallbacks
    assert settings.models.large.fallbacks[0].timeout_s == 5


def test_a_file_over_the_size_bound_is_refused_unparsed(tmp_path: Path) -> None:
    path = write(tmp_path, "# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match="over 8 MiB"):
        load_settings(path)


def test_a_fallbacks_own_fallbacks_are_refused_naming_the_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models:\n  small:\n    model: openai/a\n    fallbacks:\n"
        "      - {model: openai/b}\n"
        "      - {model: openai/c, fallbacks: [{model: openai/d}]}\n",
    )
    with pytest.raises(ConfigError, match=r"models\.small\.fallbacks: .*1\.fallbacks: a fallback"):
        load_settings(path)


def test_a_flat_fallback_list_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models:\n  small:\n    model: openai/a\n    fallbacks: [{model: openai/b}, "
        "{model: openai/c, fallbacks: []}]\n",
    )
    small = load_settings(path).models.small
    assert small is not None and [f.model for f in small.fallbacks] == ["openai/b", "openai/c"]


def test_a_refusal_names_the_keys_and_echoes_no_value(tmp_path: Path) -> None:
    # What `config check`, the start and a reload's log print: a key given a credential in the
    # wrong place is named, its value never shown.
    path = write(
        tmp_path,
        "models:\n  small:\n    model: openai/x\n    api_key: sk-live-4417\n"
        "cache:\n  ttl_s: redis://u:pw-4418@cache\n",
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    message = str(refused.value)
    assert "models.small.api_key" in message and "cache.ttl_s" in message
    assert "sk-live-4417" not in message and "pw-4418" not in message
