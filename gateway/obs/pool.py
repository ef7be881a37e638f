"""The worker pool as a worker sees it: how many of `serve --workers N` serve, and N.

The supervisor alone writes the counts into shared memory it hands each worker at start;
the metrics collector and `/readyz` read them here, so neither needs the supervisor's code.
"""

from __future__ import annotations

from typing import Any

# In a worker: the supervisor's counts, [serving, expected]; None in a single process.
_counts: Any = None


def share(counts: Any) -> None:
    """Called once in a worker, before its app starts, with the supervisor's shared array."""
    global _counts
    _counts = counts


def pool_counts() -> tuple[int, int] | None:
    """In a worker of `serve --workers N`: the workers serving (alive and ready) and N, as the
    supervisor counted them at most 0.2 s ago; None in a single process."""
    if _counts is None:
        return None
    return int(_counts[0]), int(_counts[1])
