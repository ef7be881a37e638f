"""docs/openapi.yaml as an outside fuzzer holds the server to it: schemathesis, from the
document alone, against a live gateway, with all its checks (5xx, status codes, content types,
headers, response and SSE event schemas, schema-valid requests accepted and invalid ones
refused, 405 with `Allow`, missing auth refused, ...), a fixed seed and a bounded number of
cases per operation: 0 failures.

Its own gateway (documents are written and deleted at random, the configuration reloaded),
with the fake upstream's models, so every route and parameter the document states is served.
tests/e2e/schemathesis_hooks.py keeps the one chat rule the document states in prose;
tests/e2e/schemathesis.toml sends the admin key to the admin endpoints and a tenant's to the
others, and counts a 413 as a refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.gateway import (
    ADMIN_KEY,
    KEYS,
    REPO_ROOT,
    GatewayProcess,
    start_gateway,
    stop_gateway,
)

SEED = 20261202
CASES_PER_OPERATION = 30
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def fuzzed(
    tmp_path_factory: pytest.TempPathFactory, fake_upstream: str
) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path_factory.mktemp("schemathesis"), fake_upstream)
    try:
        yield gw
    finally:
        stop_gateway(gw)


def test_schemathesis_finds_no_failure_with_all_its_checks(
    fuzzed: GatewayProcess, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    command = [
        *(sys.executable, "-m", "schemathesis.cli"),
        *("--config-file", str(HERE / "schemathesis.toml")),
        *("run", str(REPO_ROOT / "docs" / "openapi.yaml")),
        *("--url", fuzzed.url),
        *("--checks", "all"),
        *("--seed", str(SEED)),
        *("--max-examples", str(CASES_PER_OPERATION)),
        *("--workers", "1"),
        *("--request-timeout", "60"),
        *("--report", "json", "--report-json-path", str(report)),
        *("--generation-database", "none"),  # no example store in the repository
    ]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
        # the keys schemathesis.toml sends: the admin key to /admin/*, a tenant's elsewhere
        "QUERYGATE_TEST_TENANT_KEY": KEYS["acme"],
        "QUERYGATE_TEST_ADMIN_KEY": ADMIN_KEY,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500, check=False
    )
    assert report.exists(), done.stdout[-5000:] + done.stderr[-3000:]
    summary = json.loads(report.read_text())
    cases = summary["test_cases"]
    print(f"schemathesis: {cases['generated']} cases, {cases['unique_failures']} failures")
    assert (summary["failures"], summary["errors"]) == ([], []), done.stdout[-8000:]
    assert done.returncode == 0, done.stdout[-8000:]
    assert summary["operations"]["tested"] == summary["operations"]["total"]
    assert cases["generated"] >= CASES_PER_OPERATION * summary["operations"]["total"]
    # every operation reached past authentication: no key refused, no admin call unauthorised
    assert summary["warnings"]["missing_auth"] == []
