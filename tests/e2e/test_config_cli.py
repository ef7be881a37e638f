"""`querygate config schema` and `querygate config check FILE`: nothing is started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.fixtures.gateway import REPO_ROOT, gateway_config


def querygate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def schema() -> dict[str, Any]:
    done = querygate("config", "schema")
    assert done.returncode == 0, done.stderr
    published: dict[str, Any] = json.loads(done.stdout)
    return published


def test_the_schema_accepts_the_configuration_the_test_gateways_run_on(tmp_path: Path) -> None:
    published = schema()
    jsonschema.Draft202012Validator.check_schema(published)
    config = gateway_config(tmp_path / "data", 8080, "http://127.0.0.1:9/v1")
    jsonschema.Draft202012Validator(published).validate(json.loads(json.dumps(config)))


def test_the_schema_refuses_what_the_gateway_refuses() -> None:
    validator = jsonschema.Draft202012Validator(schema())
    bad = {"server": {"port": 99999}, "cache": {"backend": "memcached"}, "bogus": 1}
    paths = {"/".join(map(str, e.absolute_path)) for e in validator.iter_errors(bad)}
    assert {"server/port", "cache/backend"} <= paths
    assert any("bogus" in e.message for e in validator.iter_errors(bad))


def test_check_names_every_bad_field_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    bad = {
        "server": {"port": 99999, "max_body_bytes": -1},
        "tenants": [{"id": "bad id", "api_key_sha256": "xyz"}],
        "bogus": 1,
    }
    path.write_text(yaml.safe_dump(bad))
    done = querygate("config", "check", str(path))
    assert done.returncode == 2
    for field in (
        "server.port",
        "server.max_body_bytes",
        "tenants.0.id",
        "tenants.0.api_key_sha256",
        "bogus",
    ):
        assert f"  {field}: " in done.stderr, done.stderr
    assert done.stdout == ""


def test_check_of_a_good_file_says_ok_with_its_version_and_starts_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-created"
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(data_dir), "server": {"port": 9123}}))
    done = querygate("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"OK {path}: config version ")
    assert len(line.rsplit(" ", 1)[1]) == 12
    assert not data_dir.exists()


def test_check_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    done = querygate("config", "check", str(tmp_path / "absent.yaml"))
    assert done.returncode == 2
    assert "absent.yaml" in done.stderr


def test_the_schema_refuses_a_fallbacks_own_fallbacks() -> None:
    validator = jsonschema.Draft202012Validator(schema())
    fallback = {"model": "openai/b", "fallbacks": [{"model": "openai/c"}]}
    nested = {"models": {"small": {"model": "openai/a", "fallbacks": [fallback]}}}
    assert list(validator.iter_errors(nested))
    flat = {"models": {"small": {"model": "openai/a", "fallbacks": [{"model": "openai/b"}]}}}
    assert not list(validator.iter_errors(flat))
