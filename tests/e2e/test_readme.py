"""The README's examples, run as written against the gateway its first command runs.

Every fenced `bash` and `python` block of README.md runs in order, as a reader would paste them:
the shell blocks in one bash session (a variable one sets, like `KEY`, is there for the next),
each Python block as a script, all from a scratch directory that stands for the checkout (every
top-level entry of this one linked in, `.venv` the interpreter's environment) with a home of
its own (HOME, where the default `data_dir` lives, starts empty).
A block fails when a command in it exits non-zero (pipes included: pipefail) or when it prints
the gateway's error body; a `json` block right after a shell block shows that block's output,
and every key it shows must be in what the block printed.

The gateway is the README's first command without its setup step and with a smaller corpus:
`.venv/bin/querygate serve`, no configuration (the embedded default, the `demo` tenant, its key
in `~/.local/share/querygate/demo_api_key`), on 127.0.0.1:8080. The gateway and the blocks share
network and process namespaces of their own (bubblewrap), so port 8080 is free whatever else
runs on the machine and nothing outlives the test. Its corpus is a slice of the real Wikipedia
sample (the pages the examples ask about, and every hundredth other page), ingested before it
starts: the whole sample takes minutes and answers from a partial index meanwhile, so a test on
it would be slow and its first answer would depend on how far the ingest got. The examples are
the README's as written; only what the index holds is smaller (docs/testing.md).

A block is skipped only when an HTML comment right before it says so,
`<!-- readme-test: skip (reason) -->`: the fresh-machine commands themselves and blocks that
need a real model provider. Without bwrap this skips, unless QUERYGATE_REQUIRE_BWRAP=1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.ingest.wiki_sample import load_wiki_sample
from tests.e2e.test_pod_conditions import bwrap
from tests.fixtures.gateway import REPO_ROOT

README = REPO_ROOT / "README.md"
RUN_LANGS = ("bash", "python")
SKIP = re.compile(r"<!-- readme-test: skip \((?P<reason>[^)]+)\) -->")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<code>.*?)^```$", re.DOTALL | re.MULTILINE)
# The pages the README's questions are about, kept whatever the slice takes.
EXAMPLE_PAGES = frozenset({"Eiffel Tower", "Gustave Eiffel", "Paris"})
SAMPLE_STRIDE = 100
# Bounds on a hang, not on speed: a start on a loaded 2-core machine has passed a minute.
READY_WITHIN_S = 300
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Block:
    number: int  # its place among the README's fenced blocks
    line: int
    lang: str
    code: str
    skip: str | None  # the reason its marker gives
    shown: str | None  # the json block right after it: its output

    @property
    def id(self) -> str:
        first = self.code.strip().splitlines()[0]
        return f"L{self.line}-{self.lang}: {first[:40]}"


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block in order, with its skip marker and the output shown after it."""
    fences = list(FENCE.finditer(text))
    blocks: list[Block] = []
    for n, fence in enumerate(fences):
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.fullmatch(before.strip())
        after = fences[n + 1] if n + 1 < len(fences) else None
        shown = None
        if (
            after is not None
            and after["lang"] == "json"
            and not text[fence.end() : after.start()].strip()
        ):
            shown = after["code"]
        blocks.append(
            Block(
                number=n,
                line=text.count("\n", 0, fence.start()) + 1,
                lang=fence["lang"],
                code=fence["code"],
                skip=marker["reason"] if marker else None,
                shown=shown,
            )
        )
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
RUNNABLE = [b for b in BLOCKS if b.lang in RUN_LANGS]


def test_every_skip_marker_sits_on_a_runnable_block() -> None:
    """A marker before a yaml or json block, or one a blank paragraph away, skips nothing."""
    text = README.read_text(encoding="utf-8")
    marked = [b for b in RUNNABLE if b.skip is not None]
    assert len(SKIP.findall(text)) == len(marked)
    assert marked, "the fresh-machine commands are marked"


def test_the_fresh_machine_commands_name_scripts_that_exist() -> None:
    """The two skipped setup commands cannot run here; the scripts they name must exist."""
    commands = [b.code.split()[0] for b in RUNNABLE if b.skip and b.code.startswith("scripts/")]
    assert commands == ["scripts/quickstart.sh", "scripts/test.sh"]
    for command in commands:
        assert os.access(REPO_ROOT / command, os.X_OK), command


@dataclass(frozen=True)
class Outcome:
    status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class ReadmeRun:
    outcomes: dict[int, Outcome]
    gateway_log: str
    gateway_status: int  # once SIGTERM drained it


RUNNER = r"""
set -uo pipefail
results=$1; shift
.venv/bin/querygate serve > "$results/gateway.log" 2>&1 &
gateway=$!
ready=""
for _ in $(seq 1 $((READY_WITHIN_S * 5))); do
  kill -0 "$gateway" 2>/dev/null || break
  if [ "$(curl -s -o /dev/null -w '%{http_code}' localhost:8080/readyz)" = 200 ]; then
    ready=1; break
  fi
  sleep 0.2
done
if [ -z "$ready" ]; then
  echo "gateway not ready" > "$results/not_ready"
  kill "$gateway" 2>/dev/null; exit 0
fi
block_status=0
trap 'block_status=$?' ERR
for block in "$@"; do
  n=${block%%.*}
  block_status=0
  case "$block" in
    *.sh) source "$results/$block" > "$results/$n.out" 2> "$results/$n.err" ;;
    *.py) "$PYTHON" "$results/$block" > "$results/$n.out" 2> "$results/$n.err" ;;
  esac
  echo "$block_status" > "$results/$n.status"
done
trap - ERR
kill -TERM "$gateway"; wait "$gateway"
echo $? > "$results/gateway.status"
"""


def sample_slice() -> str:
    """The fixture corpus, as the jsonl `querygate ingest` reads."""
    documents = load_wiki_sample()
    picked = [
        d for n, d in enumerate(documents) if n % SAMPLE_STRIDE == 0 or d.doc_id in EXAMPLE_PAGES
    ]
    assert {d.doc_id for d in picked} >= EXAMPLE_PAGES
    return "".join(
        json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}) + "\n" for d in picked
    )


def scratch_checkout(root: Path) -> Path:
    """A directory that looks like this checkout before the first run."""
    checkout = root / "checkout"
    checkout.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in (".git", ".venv", ".querygate"):
            (checkout / entry.name).symlink_to(entry)
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    return checkout


def plain_environment(home: Path) -> dict[str, str]:
    """This environment without any QUERYGATE_ setting (the README's reader has none) and with
    a fresh home, so the default data_dir holds nothing of another run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("QUERYGATE_") and k != "XDG_DATA_HOME"
    }
    return {**env, "HOME": str(home), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> ReadmeRun:
    sandbox = bwrap()
    root = tmp_path_factory.mktemp("readme")
    checkout = scratch_checkout(root)
    (home := root / "home").mkdir()
    env = plain_environment(home)
    corpus = root / "sample-slice.jsonl"
    corpus.write_text(sample_slice(), encoding="utf-8")
    ingest = subprocess.run(
        [sys.executable, "-m", "gateway", "ingest", "--tenant", "demo", str(corpus)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert ingest.returncode == 0, ingest.stderr[-3000:]

    results = root / "results"
    results.mkdir()
    scripts = []
    for block in RUNNABLE:
        if block.skip is None:
            name = f"{block.number}.{'sh' if block.lang == 'bash' else 'py'}"
            (results / name).write_text(block.code, encoding="utf-8")
            scripts.append(name)
    runner = root / "runner.sh"
    runner.write_text(RUNNER.replace("READY_WITHIN_S", str(READY_WITHIN_S)), encoding="utf-8")
    # Its own network (port 8080 is free) and its own processes (the gateway dies with it).
    isolated = [
        sandbox,
        "--unshare-net",
        "--unshare-pid",
        "--dev-bind",
        "/",
        "/",
        "--proc",
        "/proc",
    ]
    isolated.append("--die-with-parent")
    subprocess.run(
        [*isolated, "bash", str(runner), str(results), *scripts],
        cwd=checkout,
        env={**env, "PYTHON": sys.executable},
        stdin=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    log = (results / "gateway.log").read_text(errors="replace")
    assert not (results / "not_ready").exists(), f"gateway not ready:\n{log[-3000:]}"
    outcomes: dict[int, Outcome] = {}
    for script in scripts:
        n = int(script.split(".")[0])
        status_file = results / f"{n}.status"
        assert status_file.exists(), f"block {n} did not finish:\n{log[-3000:]}"
        outcomes[n] = Outcome(
            status=int(status_file.read_text()),
            stdout=(results / f"{n}.out").read_text(errors="replace"),
            stderr=(results / f"{n}.err").read_text(errors="replace"),
        )
    return ReadmeRun(outcomes, log, int((results / "gateway.status").read_text()))


def json_values(output: str) -> list[Any]:
    """What the output holds as JSON: the whole of it, or each line (SSE `data:` included)."""
    values: list[Any] = []
    for text in [output, *output.splitlines()]:
        try:
            values.append(json.loads(text.strip().removeprefix("data:")))
        except ValueError:
            continue
    return values


def is_error_body(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("error"), dict)


def missing_keys(shown: Any, actual: Any, path: str = "") -> list[str]:
    """The keys `shown` has that `actual` lacks, nested dicts and first list items included."""
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return [path or "(top)"]
        gaps = [f"{path}{k}" for k in shown if k not in actual]
        for key in shown.keys() & actual.keys():
            gaps += missing_keys(shown[key], actual[key], f"{path}{key}.")
        return gaps
    if isinstance(shown, list) and shown:
        if not isinstance(actual, list) or not actual:
            return [path or "(top)"]
        return missing_keys(shown[0], actual[0], f"{path}0.")
    return []


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_the_readme_example_runs_as_written(block: Block, readme_run: ReadmeRun) -> None:
    if block.skip is not None:
        pytest.skip(f"README line {block.line}: {block.skip}")
    outcome = readme_run.outcomes[block.number]
    context = f"stdout:\n{outcome.stdout[-2000:]}\nstderr:\n{outcome.stderr[-2000:]}"
    assert outcome.status == 0, context
    printed = json_values(outcome.stdout)
    assert not [v for v in printed if is_error_body(v)], context
    if block.shown is not None:
        shown = json.loads(block.shown)
        assert printed, f"the README shows JSON after this block; it printed none\n{context}"
        assert missing_keys(shown, printed[0]) == [], context


def test_the_gateway_logged_no_error_while_the_examples_ran(readme_run: ReadmeRun) -> None:
    lines = [json.loads(x) for x in readme_run.gateway_log.splitlines() if x.startswith("{")]
    assert lines, readme_run.gateway_log[-3000:]
    errors = [x for x in lines if x.get("level") == "error" or x.get("outcome") == "error"]
    assert errors == []
    assert readme_run.gateway_status == 0, readme_run.gateway_log[-3000:]
