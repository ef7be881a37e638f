from pathlib import Path

import pytest

from gateway.settings import ConfigError, hash_api_key, load_settings

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
