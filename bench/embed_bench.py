"""The MiniLM embedder's runtimes side by side: numpy forward pass vs onnxruntime (fp32 graph).

    .venv/bin/python bench/embed_bench.py [--rounds 7] [--batch 256] [--threads 1]

One process, the two runtimes interleaved round by round (numpy, onnx, numpy, onnx, ...) so a
busy machine slows both alike; medians and ratios are what to read. Both are pinned to
`--threads` compute threads (OpenBLAS/OpenMP for numpy, set before numpy is imported;
intra-op threads for onnxruntime). Figures:

- single query: one short question per call, as the gateway embeds a request (ms, p50 / p90);
- batch: `--batch` chunks of the Wikipedia sample as ingest cuts them, one call (texts/s);
- parallel batch: the same chunks split over `--parallel` threads, each running its own slice,
  as bulk ingest does (texts/s; numpy's BLAS releases the GIL in matmuls only).

Also checks the vectors agree (max |numpy - onnx| over everything embedded).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _pin_threads(threads: int) -> None:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    _pin_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    import concurrent.futures
    import statistics
    import time

    import numpy as np

    from backends.embeddings.minilm import MiniLMEmbedder
    from backends.embeddings.onnx_minilm import OnnxMiniLMEmbedder
    from gateway.ingest.chunker import chunk_document
    from gateway.ingest.wiki_sample import load_wiki_sample

    runtimes: dict[str, MiniLMEmbedder] = {
        "numpy": MiniLMEmbedder(),
        "onnx": OnnxMiniLMEmbedder(threads=args.threads),
    }
    window = runtimes["numpy"].token_window
    docs = load_wiki_sample()[:: max(1, 10_033 // (args.batch * 2))]
    chunks = [
        c.embedding_text
        for d in docs
        for c in chunk_document(d.doc_id, d.title, d.text, window=window)
    ][: args.batch]
    tokens = sum(window.count(t) + window.special_tokens for t in chunks)
    queries = [
        "Who designed the Eiffel Tower?",
        "When did the Berlin Wall fall?",
        "What is the capital of Australia?",
        "How does photosynthesis work in plants?",
        "Which river flows through Vienna and Budapest?",
        "who wrote the novel one hundred years of solitude",
        "ERR-4471 upstream certificate expired",
        "What year was the first transistor built and by whom?",
    ]
    for embedder in runtimes.values():  # warm up: first runs allocate
        embedder.embed_sync(queries)
        embedder.embed_sync(chunks[:32])

    # Wall time on this shared machine, and CPU time (this thread's, or the process's for the
    # parallel run): texts per CPU-second hardly depends on what else the machine runs.
    single_cpu: dict[str, list[float]] = {name: [] for name in runtimes}
    batch_cpu: dict[str, list[float]] = {name: [] for name in runtimes}
    parallel_cpu: dict[str, list[float]] = {name: [] for name in runtimes}
    single: dict[str, list[float]] = {name: [] for name in runtimes}
    batch: dict[str, list[float]] = {name: [] for name in runtimes}
    parallel: dict[str, list[float]] = {name: [] for name in runtimes}
    vectors: dict[str, object] = {}
    pool = concurrent.futures.ThreadPoolExecutor(args.parallel)
    slices = [chunks[i :: args.parallel] for i in range(args.parallel)]
    for _ in range(args.rounds):
        for name, embedder in runtimes.items():
            for q in queries:
                start, cpu = time.perf_counter(), time.thread_time()
                embedder.embed_sync([q])
                single[name].append((time.perf_counter() - start) * 1000)
                single_cpu[name].append((time.thread_time() - cpu) * 1000)
            start, cpu = time.perf_counter(), time.thread_time()
            vectors[name] = embedder.embed_sync(chunks)
            batch[name].append(len(chunks) / (time.perf_counter() - start))
            batch_cpu[name].append(len(chunks) / (time.thread_time() - cpu))
            start, cpu = time.perf_counter(), time.process_time()
            list(pool.map(embedder.embed_sync, slices))
            parallel[name].append(len(chunks) / (time.perf_counter() - start))
            parallel_cpu[name].append(len(chunks) / (time.process_time() - cpu))
    pool.shutdown()

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q))

    diff = float(np.abs(np.asarray(vectors["numpy"]) - np.asarray(vectors["onnx"])).max())
    print(
        f"threads per run: {args.threads}; parallel threads: {args.parallel}; rounds: "
        f"{args.rounds}; batch: {len(chunks)} chunks, {tokens / len(chunks):.0f} tokens each "
        f"on average; os.cpu_count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'runtime':8} {'single p50 ms':>14} {'p90 ms':>8} {'CPU ms':>7} {'batch texts/s':>14} "
        f"{'per CPU-s':>10} {'parallel texts/s':>17} {'per CPU-s':>10}"
    )
    for name in runtimes:
        print(
            f"{name:8} {pct(single[name], 50):14.2f} {pct(single[name], 90):8.2f} "
            f"{pct(single_cpu[name], 50):7.2f} {statistics.median(batch[name]):14.1f} "
            f"{statistics.median(batch_cpu[name]):10.1f} {statistics.median(parallel[name]):17.1f} "
            f"{statistics.median(parallel_cpu[name]):10.1f}"
        )
    print(
        "onnx vs numpy (wall): single query "
        f"{pct(single['numpy'], 50) / pct(single['onnx'], 50):.2f}x faster (p50), batch "
        f"{statistics.median(batch['onnx']) / statistics.median(batch['numpy']):.2f}x, parallel "
        f"{statistics.median(parallel['onnx']) / statistics.median(parallel['numpy']):.2f}x; "
        f"max |numpy - onnx| = {diff:.2e}"
    )
    print(
        "onnx vs numpy (CPU): single query "
        f"{pct(single_cpu['numpy'], 50) / pct(single_cpu['onnx'], 50):.2f}x, batch "
        f"{statistics.median(batch_cpu['onnx']) / statistics.median(batch_cpu['numpy']):.2f}x, "
        "parallel "
        f"{statistics.median(parallel_cpu['onnx']) / statistics.median(parallel_cpu['numpy']):.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
