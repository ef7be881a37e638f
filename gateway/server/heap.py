"""The server's start-up heap, kept out of the cyclic garbage collector's way.

A worker holds hundreds of thousands of long-lived objects once started (the libraries'
modules, litellm's price map, the models' weights' wrappers). A full collection walks every one
of them, a stall that lands in the p99 of every request in flight under load (docs/benchmarks.md,
"Overload"; `bench/gc_pause.py` times it). `gc.freeze` moves them to the permanent generation,
which collections skip. Only `querygate serve` does it
(`create_app(freeze_heap=True)`), once, when its backends are open, before it says it is ready.
What a reload builds later is collected as usual; the first runtime, once a reload replaced it,
is freed by reference counting (any cycles in it stay: once, bounded).
"""

from __future__ import annotations

import gc


def freeze() -> None:
    """Collect what is garbage now, then freeze everything still alive."""
    gc.collect()
    gc.freeze()
