"""How long a full GC stalls a worker, before and after `gateway.server.heap.freeze`.

    .venv/bin/python bench/gc_pause.py [--rounds 3]

Builds the app as `querygate serve` does (default settings, litellm imported as the model tiers
import it), then times `gc.collect()` over everything a worker keeps alive after start-up, and
again once the heap is frozen. Prints the objects the collector tracks and each collection's
wall time. Backends are not opened (no index, no model load), so a real worker holds more.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import backends.llm.offline  # noqa: F401, I001  # before litellm: nothing downloads
import litellm  # noqa: F401  # a worker imports it for its model tiers and price map

from gateway.server import heap
from gateway.server.app import create_app
from gateway.settings import Settings


def collect_ms() -> float:
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    app = create_app(Settings())
    print(f"objects tracked by the collector: {len(gc.get_objects()):,}")
    before = [collect_ms() for _ in range(args.rounds)]
    heap.freeze()
    after = [collect_ms() for _ in range(args.rounds)]
    print("full collection, ms: " + ", ".join(f"{ms:.1f}" for ms in before))
    print(f"frozen: {gc.get_freeze_count():,} objects")
    print("after freeze, ms:    " + ", ".join(f"{ms:.1f}" for ms in after))
    del app


if __name__ == "__main__":
    main()
