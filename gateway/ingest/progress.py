"""How far an ingest is: its figures for /readyz, the answers it makes partial, and stderr.

`IngestProgress` is one ingest's count; `IngestRegistry` holds the ingests running in this
process by tenant, and those another process shares through the data directory
(`gateway.ingest.shared_progress`), so an answer to a tenant whose index is still being filled
says so (`partial_index`), and only that tenant's answers do; `ProgressDisplay` draws it on a
stream.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from gateway.ingest.shared_progress import SharedIngests

log = logging.getLogger(__name__)

State = Literal["pending", "running", "done", "failed"]

# The first-run line ("ready now ..., the rest in about ...") waits this long into the ingest:
# the first batch includes warming the model up, so an ETA from it alone is far too long.
ANNOUNCE_AFTER_S = 5.0


@dataclass(frozen=True, slots=True)
class PartialIndex:
    """What an answer from a partial index says: documents done of the total (None while the
    list is being read)."""

    done: int
    total: int | None

    def as_dict(self) -> dict[str, int | None]:
        return {"documents_done": self.done, "documents_total": self.total}

    def header(self) -> str:
        """`X-Querygate-Partial-Index`: "done/total", "done/?" while the total is unknown."""
        return f"{self.done}/{'?' if self.total is None else self.total}"


@dataclass(slots=True)
class IngestProgress:
    """How far an ingest is; `snapshot` is what /readyz shows."""

    tenant: str
    source: str
    state: State = "pending"
    done: int = 0
    total: int = 0
    # Documents found stored with the same content: skipped in a hash lookup, no embedding,
    # so they count toward `done` but not toward the rate (after a restart nearly all of them).
    unchanged: int = 0
    chunks: int = 0
    workers: int = 0
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def rate(self, now: float) -> float:
        """Documents per second actually ingested (embedded and written) in this run."""
        elapsed = (self.finished or now) - self.started
        return (self.done - self.unchanged) / elapsed if elapsed > 0 else 0.0

    def eta_s(self, now: float) -> float | None:
        """The rest at this run's rate, as if none of it were stored yet."""
        rate = self.rate(now)
        if self.state != "running" or rate <= 0:
            return None
        return (self.total - self.done) / rate

    @property
    def partial(self) -> bool:
        """Answers meanwhile come from the documents indexed so far. A failed ingest leaves
        the index partial too, but says so in /readyz only: nothing will complete it in this
        process, and the next start resumes it."""
        return self.state in ("pending", "running")

    def partial_index(self) -> PartialIndex:
        return PartialIndex(self.done, self.total if self.state != "pending" else None)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        eta = self.eta_s(now)
        return {
            "state": self.state,
            "tenant": self.tenant,
            "source": self.source,
            "documents_done": self.done,
            "documents_total": self.total,
            "documents_unchanged": self.unchanged,
            "chunks_written": self.chunks,
            "embedding_workers": self.workers,
            "rate_docs_per_s": round(self.rate(now), 1),
            "elapsed_s": round((self.finished or now) - self.started, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "partial_index": self.partial,
            **({"error": self.error} if self.error else {}),
        }


class IngestRegistry:
    """The ingests this process runs, by tenant, and with `shared` the first ingests other
    processes run on the same data directory: one tenant's partial index is said in its own
    answers only."""

    def __init__(self, shared: SharedIngests | None = None) -> None:
        self._by_tenant: dict[str, IngestProgress] = {}
        self._shared = shared

    def track(self, progress: IngestProgress) -> None:
        self._by_tenant[progress.tenant] = progress

    def partial_index(self, tenant: str) -> PartialIndex | None:
        """None when `tenant`'s index is not being filled in this process."""
        progress = self._by_tenant.get(tenant)
        if progress is not None and progress.partial:
            return progress.partial_index()
        return None if self._shared is None else self._shared.partial_index(tenant)

    @property
    def complete(self) -> bool:
        """No ingest is still filling an index (a tenant's first, for another process's)."""
        if any(p.partial for p in self._by_tenant.values()):
            return False
        return self._shared is None or not self._shared.any_partial


class ProgressDisplay:
    """Progress on a stream: a redrawn bar on a terminal, else a log line every `log_every_s`;
    with `announce`, once the rate is measured, one line saying what answers now and when the
    rest will."""

    def __init__(
        self,
        progress: IngestProgress,
        stream: TextIO | None = None,
        *,
        log_every_s: float = 10.0,
        redraw_every_s: float = 0.25,
        announce: bool = False,
    ) -> None:
        self._progress = progress
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._every = redraw_every_s if self._tty else log_every_s
        self._last = 0.0
        self._announce = announce

    def update(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if self._announce and (final or self._measured(now)):
            self._announce = False
            self._write(announcement(self._progress, now) + "\n")
        if not final and now - self._last < self._every:
            return
        self._last = now
        if self._tty:
            self._write(bar(self._progress, now) + ("\n" if final else ""))
        else:
            log.info("ingest progress", extra=self._progress.snapshot(now))

    def _measured(self, now: float) -> bool:
        p = self._progress
        return now - p.started >= ANNOUNCE_AFTER_S and p.rate(now) > 0

    def _write(self, text: str) -> None:
        # On a terminal the bar's line is cleared first: the text replaces it, not follows it.
        self._stream.write(("\r\x1b[K" if self._tty else "") + text)
        self._stream.flush()


def announcement(progress: IngestProgress, now: float) -> str:
    """What answers now and when the rest will, from the rate measured so far."""
    p = progress
    if p.state == "done":
        if p.unchanged == p.total:
            return f"{p.source}: all {p.total:,} documents already indexed; answers are complete"
        return f"{p.source}: {p.total:,} documents indexed; answers are complete"
    if p.state != "running":
        return f"{p.source}: {p.state}, {p.done:,} of {p.total:,} documents indexed"
    eta = p.eta_s(now) or 0.0
    return (
        f"answering now from {p.done:,} of {p.total:,} {p.source} documents; the rest in about "
        f"{_duration(eta)} at {p.rate(now):.0f} docs/s. Until then every answer carries "
        "partial_index and /readyz says complete: false"
    )


def bar(progress: IngestProgress, now: float, width: int = 30) -> str:
    total = max(progress.total, 1)
    filled = int(width * min(progress.done, total) / total)
    eta = progress.eta_s(now)
    eta_text = f"ETA {_duration(eta)}" if eta is not None else progress.state
    return (
        f"ingest {progress.source} [{'#' * filled}{'.' * (width - filled)}] "
        f"{progress.done:,}/{progress.total:,} docs  {progress.rate(now):.0f} docs/s  {eta_text}  "
    )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
