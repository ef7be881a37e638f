"""Ingest of the Wikipedia sample through `querygate ingest`, per embedding runtime.

    .venv/bin/python bench/ingest_bench.py                        # all 10,033 articles, onnx
    .venv/bin/python bench/ingest_bench.py --docs 1000 --runtimes numpy,onnx
    .venv/bin/python bench/ingest_bench.py --runtimes onnx,onnx-int8 --rounds 2

Each run is a fresh process on a fresh data directory (the same command a user runs), so it
includes reading the sample, chunking with the model's tokenizer, embedding on one thread per
core and the one writer's SQLite transactions. Runtimes alternate when `--rounds` > 1. Reported:
wall time, the process's CPU time, documents per CPU-second (what a busy shared machine
disturbs least) and the wall time that CPU time makes on this machine's cores when it is idle
(CPU time / cores: embedding is spread over one thread per core, the writer overlaps it).
`onnx-int8` is the onnx runtime with `embeddings.precision: int8` (the quantised graph, whose
retrieval quality bench/int8_encoder_eval.py measures with each encoder indexing the sample).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL_SAMPLE = 10_033


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=0, help="the first N articles (0: all)")
    parser.add_argument(
        "--runtimes", default="onnx", help="comma-separated: onnx, onnx-int8, numpy"
    )
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        source = Path(tmp) / "sample.jsonl"
        flag = ["--sample-corpus"]
        if args.docs:
            sys.path.insert(0, str(REPO))
            from gateway.ingest.wiki_sample import load_wiki_sample

            with source.open("w", encoding="utf-8") as f:
                for d in load_wiki_sample()[: args.docs]:
                    f.write(json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}) + "\n")
            flag = [str(source)]
        n_docs = args.docs or FULL_SAMPLE
        for round_ in range(args.rounds):
            for runtime in args.runtimes.split(","):
                config = Path(tmp) / f"{runtime}.yaml"
                data = Path(tmp) / f"data-{runtime}-{round_}"
                config.write_text(f"data_dir: {data}\nembeddings:\n{embeddings_yaml(runtime)}")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.monotonic()
                done = subprocess.run(
                    [
                        str(REPO / ".venv/bin/querygate"),
                        "--config",
                        str(config),
                        "--log-level",
                        "WARNING",
                        "ingest",
                        "--tenant",
                        "bench",
                        *flag,
                    ],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                wall = time.monotonic() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                results.setdefault(runtime, []).append((wall, cpu))
                print(f"{runtime}: {done.stdout.strip()}", flush=True)
    print(f"{n_docs:,} documents; {cores} cores; load average {os.getloadavg()[0]:.1f}")
    print(f"{'runtime':8} {'wall s':>8} {'CPU s':>8} {'docs/CPU-s':>11} {'idle wall s':>12}")
    for runtime, runs in results.items():
        wall = sum(w for w, _ in runs) / len(runs)
        cpu = sum(c for _, c in runs) / len(runs)
        print(f"{runtime:8} {wall:8.1f} {cpu:8.1f} {n_docs / cpu:11.1f} {cpu / cores:12.0f}")
    for other in ("numpy", "onnx-int8"):
        if "onnx" in results and other in results:
            walls = {r: sum(w for w, _ in runs) for r, runs in results.items()}
            cpus = {r: sum(c for _, c in runs) for r, runs in results.items()}
            print(
                f"{other} / onnx: {walls[other] / walls['onnx']:.2f}x the wall time, "
                f"{cpus[other] / cpus['onnx']:.2f}x the CPU-seconds"
            )
    return 0


def embeddings_yaml(runtime: str) -> str:
    """The `embeddings` section of a runtime's config."""
    if runtime == "onnx-int8":
        return "  runtime: onnx\n  precision: int8\n"
    return f"  runtime: {runtime}\n"


if __name__ == "__main__":
    raise SystemExit(main())
