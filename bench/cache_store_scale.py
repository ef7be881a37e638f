"""How the Redis cache store's semantic lookup scales with one tenant's entries (1k, 10k, 100k).

    python bench/cache_store_scale.py [--sizes 1000,10000,100000] [--probes 1000]
                                      [--bands 12 --bits 16 --flips 3 --bucket-limit 12]
                                      [--redis-url URL]

Starts its own throwaway redis-server (Debian's 7.0) unless --redis-url is given, fills one
tenant's scope step by step through `RedisCacheStore.put`, and at each size prints the p50/p99
latency of `nearest` (the whole call: LSH buckets, one script, float16 decode, exact cosine,
the fetch of the best entries), the candidates it scored, Redis memory per entry, and recall:
the share of probes whose true nearest entry (brute force over every entry) at cosine >= 0.9
is the store's first answer.

Vectors. Real question embeddings from all-MiniLM-L6-v2 (FanOutQA dev questions and
sub-questions, plus the router's generated training questions: ~5.7k questions, embedded at
start, ~30 s). Embedding 100k distinct questions would take ~8 minutes, so entries are made
from them: a random real question pulled toward a second one, plus noise. That keeps MiniLM's
anisotropy (unrelated questions sit at cosine ~0.1-0.3, not at 0 as random vectors do, and
questions on one subject crowd together), which is what makes LSH buckets fill unevenly; the
printed mean pairwise cosines of real and generated vectors show the two match. Probes are
paraphrases of a random stored entry: the entry plus noise, at cosine 0.90-0.99 to it, the
range a semantic tier acts on (its threshold is 0.95 by default).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# One BLAS thread: idle OpenBLAS workers spin, and on two shared cores they would take CPU
# from the Redis server being measured.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from backends.cache.base import CachedEntry  # noqa: E402
from backends.cache.redis import RedisCacheStore  # noqa: E402
from backends.embeddings.minilm import MiniLMEmbedder  # noqa: E402
from backends.redis_client import RedisConnection, RedisOptions  # noqa: E402
from tests.redis_server import running_redis  # noqa: E402

F32 = npt.NDArray[np.float32]
TENANT = "bench"
SCOPE = "scope"
SEED = 7
PAYLOAD = b"x" * 600  # about one short cited answer
FILL_CONCURRENCY = 64


def _fanoutqa_dev() -> Path:
    spec = importlib.util.find_spec("fanoutqa")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("fanoutqa is not installed: pip install --no-deps fanoutqa")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "fanout-final-dev.json"


def real_questions() -> list[str]:
    """FanOutQA dev (never its test split) and the router's generated training questions."""
    questions: list[str] = []
    for item in json.loads(_fanoutqa_dev().read_text("utf-8")):
        questions.append(item["question"])
        questions.extend(sub["question"] for sub in item["decomposition"])
    generated = REPO / "routers" / "data" / "generated_train.jsonl"
    for line in generated.read_text("utf-8").splitlines():
        questions.append(json.loads(line)["text"])
    return sorted(set(questions))


def _normalise(m: F32) -> F32:
    out: F32 = (m / np.linalg.norm(m, axis=-1, keepdims=True)).astype(np.float32)
    return out


def synthetic_entries(real: F32, count: int, rng: np.random.Generator) -> F32:
    """A real question pulled toward another (weight 0.35) plus isotropic noise (0.02 per
    dimension, ~0.4 in norm): new points where questions actually lie."""
    i = rng.integers(0, len(real), count)
    j = rng.integers(0, len(real), count)
    noise = rng.standard_normal((count, real.shape[1])).astype(np.float32) * 0.02
    return _normalise(real[i] + 0.35 * real[j] + noise)


def paraphrase(of: F32, rng: np.random.Generator) -> tuple[F32, float]:
    """A vector at a random cosine in [0.90, 0.99] to `of` (a unit vector)."""
    target = rng.uniform(0.90, 0.99)
    orth = rng.standard_normal(of.shape[0]).astype(np.float32)
    orth -= np.dot(orth, of) * of
    orth /= np.linalg.norm(orth)
    v = target * of + np.sqrt(1 - target**2) * orth
    return v.astype(np.float32), float(target)


def mean_pairwise_cosine(m: F32, rng: np.random.Generator, pairs: int = 20_000) -> float:
    a = rng.integers(0, len(m), pairs)
    b = rng.integers(0, len(m), pairs)
    keep = a != b
    return float(np.mean(np.sum(m[a[keep]] * m[b[keep]], axis=1)))


async def embedded(questions: list[str]) -> F32:
    """MiniLM embeddings of the questions, kept in the temp dir between runs (embedding them
    takes 30 s on an idle 2-core machine, minutes on a busy one)."""
    digest = hashlib.sha256("\n".join(questions).encode()).hexdigest()[:16]
    cached = Path(tempfile.gettempdir()) / f"querygate-bench-minilm-{digest}.npy"
    if cached.exists():
        loaded: F32 = np.load(cached)
        print(f"{len(questions)} real questions, embeddings from {cached}")
        return loaded
    started = time.perf_counter()
    embedder = MiniLMEmbedder()
    real = _normalise(np.asarray(await embedder.embed(questions), dtype=np.float32))
    await embedder.aclose()
    print(f"embedded {len(questions)} real questions in {time.perf_counter() - started:.0f}s")
    np.save(cached, real)
    return real


@dataclass
class Figures:
    size: int
    p50_ms: float
    p99_ms: float
    candidates_mean: float
    candidates_max: int
    recall: float
    recall_at_4: float
    judged: int
    bytes_per_entry: float
    server_us: float
    client_cpu_ms: float


async def fill(store: RedisCacheStore, vectors: F32, start: int, stop: int) -> None:
    async def put(i: int) -> None:
        entry = CachedEntry(f"k{i}", f"question {i}", PAYLOAD, vectors[i])
        await store.put(TENANT, SCOPE, entry, ttl_s=86_400, max_entries=10_000_000)

    for batch in range(start, stop, FILL_CONCURRENCY):
        await asyncio.gather(*(put(i) for i in range(batch, min(stop, batch + FILL_CONCURRENCY))))


async def measure(
    store: RedisCacheStore, connection: RedisConnection, vectors: F32, size: int, probes: int
) -> Figures:
    rng = np.random.default_rng(SEED + size)
    stored = vectors[:size]
    # Probes and their true nearest entries first, so the brute force stays out of the timing.
    probe_vectors = [paraphrase(stored[rng.integers(0, size)], rng)[0] for _ in range(probes)]
    truths = [int(np.argmax(stored @ p)) for p in probe_vectors]
    judged_flags = [float(stored[t] @ p) >= 0.9 for t, p in zip(truths, probe_vectors, strict=True)]
    latencies: list[float] = []
    candidates: list[int] = []
    cpu: list[float] = []
    hits = hits_at_4 = 0
    await connection.call(connection.client.config_resetstat())
    for probe, truth, judged in zip(probe_vectors, truths, judged_flags, strict=True):
        started, cpu_started = time.perf_counter(), time.thread_time()
        found = await store.nearest(TENANT, SCOPE, probe, limit=4)
        latencies.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - cpu_started) * 1000)
        candidates.append(store.last_candidates)
        keys = [n.entry.key for n in found]
        hits += judged and keys[:1] == [f"k{truth}"]
        hits_at_4 += judged and f"k{truth}" in keys
    info = await connection.call(connection.client.info("memory"))
    stats = await connection.call(connection.client.info("commandstats"))
    # Redis's own time per script call (the candidate read and the fetch of the best entries)
    server_us = float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", float("nan")))
    judged_count = sum(judged_flags)
    return Figures(
        size=size,
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        candidates_mean=float(np.mean(candidates)),
        candidates_max=max(candidates),
        recall=hits / judged_count if judged_count else float("nan"),
        recall_at_4=hits_at_4 / judged_count if judged_count else float("nan"),
        judged=judged_count,
        bytes_per_entry=float(info["used_memory"]) / size,
        server_us=server_us,
        client_cpu_ms=float(np.mean(cpu)),
    )


async def run(args: argparse.Namespace, url: str) -> None:
    sizes = sorted(int(s) for s in args.sizes.split(","))
    rng = np.random.default_rng(SEED)
    questions = real_questions()
    real = await embedded(questions)
    vectors = synthetic_entries(real, sizes[-1], rng)
    print(
        f"mean pairwise cosine: real questions {mean_pairwise_cosine(real, rng):.3f}, "
        f"generated entries {mean_pairwise_cosine(vectors, rng):.3f}"
    )
    connection = RedisConnection(RedisOptions(url, socket_timeout_s=5, connect_timeout_s=5))
    await connection.start()
    store = RedisCacheStore(
        connection,
        bands=args.bands,
        bits=args.bits,
        bucket_limit=args.bucket_limit,
        flips=args.flips,
    )
    print(
        f"LSH {args.bands} bands x {args.bits} bits, {args.flips} flips, newest "
        f"{args.bucket_limit} per bucket (at most {store.max_candidates} candidates); "
        f"{args.probes} probes per size, "
        "limit 4\n"
    )
    print(
        f"{'entries':>8} {'p50 ms':>7} {'p99 ms':>7} {'cand. mean':>10} {'cand. max':>9} "
        f"{'recall@1 (>=0.9)':>17} {'@4':>5} {'bytes/entry':>11} {'redis us/script':>15} "
        f"{'client cpu ms':>13} {'load':>5}"
    )
    filled = 0
    try:
        for size in sizes:
            await fill(store, vectors, filled, size)
            filled = size
            f = await measure(store, connection, vectors, size, args.probes)
            print(
                f"{f.size:>8} {f.p50_ms:>7.2f} {f.p99_ms:>7.2f} {f.candidates_mean:>10.0f} "
                f"{f.candidates_max:>9} {f.recall:>11.3f} ({f.judged:>3}) {f.recall_at_4:>5.3f} "
                f"{f.bytes_per_entry:>11.0f} "
                f"{f.server_us:>15.0f} {f.client_cpu_ms:>13.2f} {os.getloadavg()[0]:>5.1f}"
            )
    finally:
        await store.aclose()
        await connection.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--probes", type=int, default=1000)
    parser.add_argument("--bands", type=int, default=12)
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--bucket-limit", type=int, default=12)
    parser.add_argument("--flips", type=int, default=3)
    parser.add_argument("--redis-url", default=None, help="default: a throwaway redis-server")
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(run(args, args.redis_url))
        return
    with running_redis() as server:
        asyncio.run(run(args, server.url))


if __name__ == "__main__":
    main()
