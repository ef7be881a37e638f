"""The Helm chart as tests see it: a real helm (scripts/helm.sh) rendering helm/querygate.

QUERYGATE_HELM names the binary, else the per-machine cache scripts/helm.sh builds into is
searched. Without one a test skips, unless QUERYGATE_REQUIRE_HELM=1 (scripts/test.sh sets it):
then it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "querygate"

Doc = dict[str, Any]


class HelmFailed(Exception):
    """helm refused (lint or template); the message is helm's."""


def _find_helm() -> str | None:
    named = os.environ.get("QUERYGATE_HELM")
    if named:
        return named
    root = os.environ.get("QUERYGATE_HELM_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "querygate" / "helm"
    )
    built = sorted(Path(root).glob("v*/helm"))
    return str(built[-1]) if built else shutil.which("helm")


@cache
def helm() -> str:
    found = _find_helm()
    if found is None or not os.access(found, os.X_OK):
        message = f"no helm binary ({found or 'none found'}): run scripts/helm.sh"
        if os.environ.get("QUERYGATE_REQUIRE_HELM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_helm(*args: str, chart: Path = CHART, values: Doc | None = None) -> str:
    """helm ARGS CHART [--values -]; raises HelmFailed with helm's message when it refuses."""
    command = [helm(), *args, str(chart)]
    if values:
        command += ["--values", "-"]
    done = subprocess.run(
        command,
        input=json.dumps(values or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise HelmFailed(done.stderr + done.stdout)
    return done.stdout


@cache
def _template(values_json: str, release: str, namespace: str, chart: Path) -> str:
    values = json.loads(values_json)
    return run_helm("template", release, "--namespace", namespace, chart=chart, values=values)


def render(
    values: Doc | None = None,
    release: str = "rel",
    namespace: str = "qg",
    chart: Path = CHART,
) -> list[Doc]:
    """The rendered objects (cached by value: several tests ask for the same rendering)."""
    out = _template(json.dumps(values or {}, sort_keys=True), release, namespace, chart)
    return [d for d in yaml.safe_load_all(out) if d]


def notes(values: Doc, tmp_path: Path) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` renders it but prints nothing, and
    an install needs a cluster, so a copy of the chart renders it through `tpl` into a ConfigMap."""
    chart = tmp_path / "querygate"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(CHART / "templates" / "NOTES.txt", chart / "files" / "notes.txt")
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
            'data: {notes: {{ tpl (.Files.Get "files/notes.txt") . | toJson }}}\n'
        )
    (found,) = [d for d in render(values, chart=chart) if d["metadata"]["name"] == "notes"]
    text: str = found["data"]["notes"]
    return text
