"""The CLI's contract: bad configuration exits non-zero naming the field; the demo tenant's key
is generated once, stored, and not printed again; `querygate ingest` names a blank file (white
space or invisible characters only, `gateway.text.is_blank`) and ingests nothing of it, names a
missing path and ingests the rest (exit 1), finds the same index from any folder, and with
`--prune` lists what a folder no longer has, deleting it only with `--apply`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests

from tests.fixtures.gateway import REPO_ROOT, free_port, run_cli


def test_an_invalid_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("retrieval:\n  k: 0\nrouter:\n  rules:\n    - {name: x, then: {route: up}}\n")
    done = run_cli(config, "route", "hello")
    assert done.returncode == 2
    assert "retrieval.k" in done.stderr
    assert "router.rules.0.then.route" in done.stderr


def test_demo_key_is_generated_once_and_kept(tmp_path: Path) -> None:
    env = {"QUERYGATE_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    first = _serve_briefly(env)
    key_file = tmp_path / "data" / "demo_api_key"
    key = key_file.read_text().strip()
    assert key in first
    assert key_file.stat().st_mode & 0o077 == 0
    second = _serve_briefly(env)
    assert key not in second
    assert "stored in" in second


def _serve_briefly(env: dict[str, str]) -> str:
    """Start `querygate serve` with no config, check the demo key works, stop it; its stderr."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_ready(port)
        key = (Path(env["QUERYGATE_DATA_DIR"]) / "demo_api_key").read_text().strip()
        ok = requests.post(
            f"http://127.0.0.1:{port}/v1/route",
            json={"query": "hello"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert ok.status_code == 200, ok.text
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    return stderr


def _wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                return
        except requests.ConnectionError:
            time.sleep(0.2)
    raise AssertionError("querygate serve did not start")


def test_an_unreadable_file_exits_2_naming_it_without_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "ok", "text": "fine"}\nnot json\n')
    done = run_cli(config, "ingest", "--tenant", "t", str(bad))
    assert done.returncode == 2, done.stderr
    assert "bad.jsonl:2" in done.stderr
    assert "Traceback" not in done.stderr


def test_ingest_skips_unchanged_documents_unless_told_to_rechunk(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    doc = tmp_path / "warranty.md"
    doc.write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    reports = []
    for flags in ((), (), ("--rechunk",)):
        done = run_cli(config, "ingest", "--tenant", "t", *flags, str(doc))
        assert done.returncode == 0, done.stderr[-2000:]
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [(r["added"], r["unchanged"], r["updated"]) for r in reports] == [
        (1, 0, 0),
        (0, 1, 0),
        (0, 0, 1),
    ]


def test_ingest_refuses_a_document_over_the_chunk_cap_and_keeps_the_rest(tmp_path: Path) -> None:
    """A batch ingest embeds nothing of a document making more than
    server.max_document_chunks chunks: it is named and the exit status says so (1); the other
    documents are ingested."""
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nserver: {{max_document_chunks: 20}}\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "warranty.md").write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    (docs / "dense.txt").write_text("a-" * 20_000)  # ~160 chunks: tokens past 20 windows
    (docs / "parts.md").write_text("\n".join(f"# Part {i}\nPart {i}." for i in range(30)))
    done = run_cli(config, "ingest", "--tenant", "t", str(docs))
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["added"], report["too_large"]) == (1, 2)
    assert "max_document_chunks (20)" in done.stderr
    assert "dense.txt" in done.stderr and "parts.md" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_config_refused_while_starting_the_backends_exits_2_naming_it(tmp_path: Path) -> None:
    # the learned models were trained on MiniLM's vectors: another embedding model cannot use them
    config = tmp_path / "config.yaml"
    config.write_text(
        f"data_dir: {tmp_path / 'data'}\n"
        "server: {port: 0}\n"
        "embeddings: {backend: litellm, model: openai/other-embed, api_base: http://127.0.0.1:9}\n"
    )
    done = run_cli(config, "serve")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "router.escalation.method" in done.stderr and "retrain" in done.stderr
    assert "Traceback" not in done.stderr


def warranty_docs(tmp_path: Path) -> tuple[Path, Path]:
    """A configuration with its data_dir in `tmp_path`, and a folder of one document."""
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "warranty.md").write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    return config, docs


def test_ingest_names_an_invisible_only_file_and_ingests_nothing_of_it(tmp_path: Path) -> None:
    config, docs = warranty_docs(tmp_path)
    (docs / "ghost.txt").write_text("\u200b\u200e\n\u2060\n", encoding="utf-8")
    done = run_cli(config, "ingest", "--tenant", "t", str(docs))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["added"] == 1
    assert "blank text" in done.stderr and "ghost.txt" in done.stderr
    assert "Traceback" not in done.stderr


def _cli_in(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`querygate ARGS` run from `cwd`, this checkout's package on the path."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QUERYGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        env={**clean, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    report: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_ingest_names_a_missing_path_ingests_the_rest_and_exits_1(tmp_path: Path) -> None:
    config, docs = warranty_docs(tmp_path)
    done = run_cli(config, "ingest", "--tenant", "t", str(docs), str(tmp_path / "notes.md"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"skipped, no such file or directory: {tmp_path / 'notes.md'}" in done.stderr
    assert "Traceback" not in done.stderr
    assert (_report(done)["added"], _report(done)["missing_paths"]) == (1, 1)
    # A first ingest: shared with a gateway while it ran (the folder), and done (no file).
    shared = tmp_path / "data" / "ingests"
    assert shared.is_dir() and not list(shared.glob("*.json"))
    again = run_cli(config, "ingest", "--tenant", "t", str(docs))
    assert again.returncode == 0, again.stderr[-2000:]
    assert _report(again)["unchanged"] == 1  # it was stored


def test_ingest_of_only_missing_paths_exits_2_and_makes_no_index(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    done = run_cli(config, "ingest", "--tenant", "t", str(tmp_path / "notes.md"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"skipped, no such file or directory: {tmp_path / 'notes.md'}" in done.stderr
    assert "nothing to ingest" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "index.sqlite3").exists()


def test_a_relative_data_dir_is_the_config_files_whatever_the_current_directory(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "conf"
    elsewhere = tmp_path / "elsewhere"
    conf.mkdir()
    elsewhere.mkdir()
    (conf / "config.yaml").write_text("data_dir: data\n")
    doc = tmp_path / "warranty.md"
    doc.write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    args = ("--config", str(conf / "config.yaml"), "ingest", "--tenant", "t", str(doc))
    first = _cli_in(conf, {}, *args)
    assert first.returncode == 0, first.stderr[-2000:]
    # A new index is said on stderr, naming where it is.
    assert f"no index at {conf / 'data' / 'index.sqlite3'}: creating a new one" in first.stderr
    second = _cli_in(elsewhere, {}, *args)
    assert second.returncode == 0, second.stderr[-2000:]
    assert _report(second)["unchanged"] == 1  # the same index, found from another folder
    assert "creating a new one" not in second.stderr
    assert not (elsewhere / "data").exists()


def test_with_no_configuration_the_data_dir_is_the_one_default(tmp_path: Path) -> None:
    home = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    doc = tmp_path / "warranty.md"
    doc.write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    for n, cwd in enumerate((tmp_path, REPO_ROOT)):
        done = _cli_in(cwd, home, "ingest", "--tenant", "t", str(doc))
        assert done.returncode == 0, done.stderr[-2000:]
        assert _report(done)["unchanged" if n else "added"] == 1
    assert (tmp_path / "xdg" / "querygate" / "index.sqlite3").is_file()


def test_an_ingest_into_an_opensearch_alias_no_gateway_made_says_so(
    tmp_path: Path, opensearch_url: str
) -> None:
    """The OpenSearch twin of the embedded notice: an alias whose meta index no gateway's start
    created is most often not the one a gateway serves (another alias, another cluster)."""
    alias = f"qgtest-cli-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"data_dir: {tmp_path / 'data'}\n"
        "retrieval:\n"
        "  backend: opensearch\n"
        f"  opensearch: {{hosts: ['{opensearch_url}'], alias: {alias}, "
        "search_timeout_s: 15, write_timeout_s: 60}\n"
    )
    doc = tmp_path / "warranty.md"
    doc.write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    try:
        first = run_cli(config, "ingest", "--tenant", "t", str(doc))
        assert first.returncode == 0, first.stderr[-2000:]
        assert f"no index {alias!r} at {opensearch_url}: creating a new one" in first.stderr
        second = run_cli(config, "ingest", "--tenant", "t", str(doc))
        assert second.returncode == 0, second.stderr[-2000:]
        assert "creating a new one" not in second.stderr
    finally:
        requests.delete(f"{opensearch_url}/{alias}*", timeout=60)


def test_ingest_prune_lists_first_and_deletes_only_with_apply(tmp_path: Path) -> None:
    """The CLI's side of a prune (what it decides: tests/integration/test_ingest_prune.py): a
    dry run names each document it would delete on stderr and exits as the ingest does; bad
    prune options exit 2 before anything is written."""
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("warranty", "returns"):
        (docs / f"{name}.md").write_text(f"# {name.title()}\n\nAcme's {name} policy.\n")
    assert run_cli(config, "ingest", "--tenant", "t", str(docs)).returncode == 0
    (docs / "returns.md").unlink()
    for bad in (("--apply",), ("--prune", "--source", " "), ("--prune", "--sample-corpus")):
        paths = () if "--sample-corpus" in bad else (str(docs),)
        refused = run_cli(config, "ingest", "--tenant", "t", *bad, *paths)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    runs = []
    for flags in (("--prune",), ("--prune", "--apply")):
        done = run_cli(config, "ingest", "--tenant", "t", *flags, str(docs), str(tmp_path / "no"))
        assert done.returncode == 1, done.stderr[-2000:]  # the missing path, not the prune
        runs.append((_report(done), done.stderr))
    (dry, dry_err), (applied, applied_err) = runs
    source = docs.resolve().as_posix()
    assert (dry["stale"], dry["pruned"]) == (1, 0)
    assert f"would delete, no longer in {source}: returns.md" in dry_err
    assert "add --apply to delete" in dry_err
    assert (applied["stale"], applied["pruned"]) == (1, 1)
    assert f"deleted, no longer in {source}: returns.md" in applied_err
