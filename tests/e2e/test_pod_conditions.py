"""The gateway as the chart's pod runs it: read-only root, only the data dir and /tmp writable.

No container engine runs here, so bubblewrap builds the pod's conditions around this checkout:
everything mounted read-only, a fresh /tmp, an empty writable data dir at the chart's path, the
configuration the chart renders, the container's command and arguments as the chart renders
them (`--workers 2`, so the metrics' multiprocess files are written too), the image's
environment (the Dockerfile's ENV), and no capabilities. The process runs as root with every
capability dropped rather than as uid 10001: this checkout's interpreter may live where another
user cannot read; the chart and the Dockerfile agree on the uid (tests/unit/test_helm_chart.py).

Without bwrap this skips, unless QUERYGATE_REQUIRE_BWRAP=1 (scripts/test.sh installs it and sets
that): then it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.fixtures.gateway import free_port
from tests.helm_chart import REPO, Doc, render

# Needs a Go tool that scripts/test.sh builds (helm or Jaeger): it runs these once it is built.
pytestmark = pytest.mark.gotools

DATA_DIR = "/var/lib/querygate"
# /etc/querygate cannot be made inside a read-only /etc; the path does not matter to the gateway.
CONFIG_DIR = "/var/lib/querygate-config"
START_TIMEOUT_S = 180.0


def bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        message = "no bwrap (apt-get install bubblewrap)"
        if os.environ.get("QUERYGATE_REQUIRE_BWRAP") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def image_environment() -> dict[str, str]:
    """The final stage's ENV of the Dockerfile, PATH pointed at this checkout's venv."""
    final = (REPO / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    joined = re.sub(r"\\\n\s*", " ", final)
    env: dict[str, str] = {}
    for line in joined.splitlines():
        if line.startswith("ENV "):
            for pair in line.removeprefix("ENV ").split():
                key, value = pair.split("=", 1)
                env[key] = value
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env["PYTHONPATH"] = str(REPO)  # this checkout's code, whichever the venv was installed from
    return env


@dataclass
class Pod:
    url: str
    proc: subprocess.Popen[bytes]
    data: Path
    log_path: Path
    drain_s: float

    def gateway_pid(self) -> int:
        """The pod's main process: bwrap's child (bwrap itself forwards no signal)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _one(docs: list[Doc], kind: str, name: str = "rel-querygate") -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    sandbox = bwrap()
    port = free_port()
    docs = render({"containerPort": port, "workers": 2})
    config = yaml.safe_load(_one(docs, "ConfigMap")["data"]["config.yaml"])
    assert config["data_dir"] == DATA_DIR
    container = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    command = [
        f"{CONFIG_DIR}/config.yaml" if arg == "/etc/querygate/config.yaml" else arg
        for arg in container["command"] + container["args"]
    ]
    root = tmp_path_factory.mktemp("pod")
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    data = root / "data"
    data.mkdir()
    env_args = [
        arg for key, value in image_environment().items() for arg in ("--setenv", key, value)
    ]
    # The pod's /tmp is empty; a checkout (or its venv) under /tmp, as CI's may be, stays visible.
    code = {REPO, (REPO / ".venv").resolve()}
    visible = [a for p in sorted(code) if p.is_relative_to("/tmp") for a in ("--ro-bind", p, p)]
    argv = [
        sandbox,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "1777", "--tmpfs", "/tmp",
        *map(str, visible),
        "--tmpfs", "/var/lib",
        "--bind", str(data), DATA_DIR,
        "--ro-bind", str(root / "config"), CONFIG_DIR,
        "--remount-ro", "/var/lib",
        "--chdir", DATA_DIR,
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--clearenv", *env_args,
        "--", *command,
    ]  # fmt: skip
    log_path = root / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    drain_s = float(config["server"]["shutdown_grace_s"])
    running = Pod(f"http://127.0.0.1:{port}", proc, data, log_path, drain_s)
    try:
        _wait_healthy(running)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _wait_healthy(pod: Pod) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if pod.proc.poll() is not None:
            pytest.fail(f"the gateway exited {pod.proc.returncode}:\n{pod.log()[-4000:]}")
        try:
            if requests.get(f"{pod.url}/healthz", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    pytest.fail(f"the gateway did not come up in {START_TIMEOUT_S} s:\n{pod.log()[-4000:]}")


def test_the_probes_answer_on_a_read_only_root(pod: Pod) -> None:
    assert requests.get(f"{pod.url}/healthz", timeout=5).status_code == 200
    # A worker answers /healthz as soon as it serves; /readyz counts it once the supervisor
    # has (every 0.2 s, later on a busy machine): it must turn ready, and stay so.
    deadline = time.monotonic() + 10
    while (ready := requests.get(f"{pod.url}/readyz", timeout=5)).status_code != 200:
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.2)
    assert ready.json()["workers"]["serving"] >= 1, ready.text


def test_documents_and_answers_work_writing_only_to_the_data_dir(pod: Pod) -> None:
    # No tenant configured: the demo key is generated into the data dir.
    key = (pod.data / "demo_api_key").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    text = "ERR-4471 means the upstream certificate expired."
    put = requests.put(
        f"{pod.url}/v1/documents/router-faq",
        json={"title": "Router FAQ", "text": text},
        headers=headers,
        timeout=60,
    )
    assert put.status_code == 201, put.text
    answer = requests.post(
        f"{pod.url}/v1/query",
        json={"query": "What does ERR-4471 mean?"},
        headers=headers,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert [c["doc_id"] for c in answer.json()["citations"]][:1] == ["router-faq"]
    assert (pod.data / "index.sqlite3").exists()


def test_metrics_are_summed_over_the_workers_from_tmp(pod: Pod) -> None:
    metrics = requests.get(f"{pod.url}/metrics", timeout=5)
    assert metrics.status_code == 200
    assert 'querygate_http_requests_total{endpoint="GET /healthz"' in metrics.text


def test_nothing_failed_on_a_read_only_path(pod: Pod) -> None:
    log = pod.log()
    assert "Read-only file system" not in log
    assert "Traceback" not in log


def test_sigterm_drains_within_the_pods_grace(pod: Pod) -> None:
    # Last in this module: it stops the pod.
    os.kill(pod.gateway_pid(), signal.SIGTERM)
    started = time.monotonic()
    assert pod.proc.wait(timeout=pod.drain_s + 10) == 0, pod.log()[-4000:]
    assert time.monotonic() - started <= pod.drain_s + 10
