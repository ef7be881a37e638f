"""What a one-shot command's process start costs, with and without litellm's import.

    .venv/bin/python bench/cli_start.py [--runs 5]

Runs `querygate eval routes FILE --tenant demo` on a file whose second line is not JSON (the
command prints one error and exits 2: nothing but the start and the check is timed), in a fresh
interpreter each time, two ways interleaved: as shipped, and with `litellm` imported first (what
every command paid while the request core imported it at module level). Prints the median wall
and CPU seconds (the child's user + system time) of each and their ratio. The data directory is
a temporary one, so no index of the caller's is read.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGV = "['eval', 'routes', {path!r}, '--tenant', 'demo']"
SHIPPED = "import sys\nfrom gateway.cli.main import main\nsys.exit(main({argv}))"
WITH_LITELLM = "import backends.llm.offline, litellm\n" + SHIPPED
ARMS = {"as shipped": SHIPPED, "litellm imported first": WITH_LITELLM}


def run_once(code: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 2 or "not JSON" not in done.stderr:
        raise RuntimeError(f"the command did not refuse the file: {done.returncode} {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cli-start-") as tmp:
        bad = Path(tmp) / "bad.jsonl"
        bad.write_text('{"question": "a", "route": "direct"}\nnot json\n')
        env = {**os.environ, "QUERYGATE_DATA_DIR": str(Path(tmp) / "data")}
        codes = {arm: code.format(argv=ARGV.format(path=str(bad))) for arm, code in ARMS.items()}
        times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
        for _ in range(args.runs):
            for arm, code in codes.items():
                times[arm].append(run_once(code, env))
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}")
    print(f"{'arm':<26}{'wall s (median)':>17}{'CPU s (median)':>16}")
    medians = {}
    for arm, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        medians[arm] = (wall, cpu)
        print(f"{arm:<26}{wall:>17.2f}{cpu:>16.2f}")
    shipped, old = medians["as shipped"], medians["litellm imported first"]
    wall, cpu = shipped[0] / old[0], shipped[1] / old[1]
    print(f"as shipped / litellm first: wall {wall:.2f}x, CPU {cpu:.2f}x")


if __name__ == "__main__":
    main()
