"""A tenant's first ingest by another process, as the gateway sees it: through the data dir.

`querygate ingest` filling a tenant's index for the first time (it had no document, or an
earlier first ingest of it stopped part way) keeps a small file in `<data_dir>/ingests/`
saying how far it is, and removes it when every document is in. A gateway on the same data
directory reads it (at most once a second per tenant), so that tenant's answers say
`partial_index` meanwhile, as they do for an ingest in the gateway's own process. A file left
by an ingest that stopped keeps saying so: the index is partial until an ingest completes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from gateway.ingest.progress import IngestProgress, PartialIndex

FOLDER = "ingests"
WRITE_EVERY_S = 1.0
READ_EVERY_S = 1.0


def progress_path(data_dir: Path, tenant: str) -> Path:
    """The tenant's file; named by a digest, as a tenant id may hold any character."""
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:24]
    return data_dir / FOLDER / f"{digest}.json"


class ProgressFile:
    """The writer: `update` after each step (written at most every WRITE_EVERY_S, atomically),
    `remove` when the ingest has every document in."""

    def __init__(self, data_dir: Path, progress: IngestProgress) -> None:
        self.path = progress_path(data_dir, progress.tenant)
        self._progress = progress
        self._written = -WRITE_EVERY_S

    def update(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < WRITE_EVERY_S:
            return
        self._written = now
        p = self._progress
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staged = self.path.with_suffix(f".{os.getpid()}.tmp")
        staged.write_text(json.dumps({"tenant": p.tenant, "done": p.done, "total": p.total}))
        staged.replace(self.path)  # a reader sees the old figures or the new, never half

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class SharedIngests:
    """The reader, for the gateway: each tenant's file looked at no more than once per
    READ_EVERY_S however many answers ask."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._seen: dict[str, tuple[float, PartialIndex | None]] = {}
        self._any: tuple[float, bool] = (-READ_EVERY_S, False)

    def partial_index(self, tenant: str) -> PartialIndex | None:
        now = time.monotonic()
        checked = self._seen.get(tenant)
        if checked is not None and now - checked[0] < READ_EVERY_S:
            return checked[1]
        found = self._read(tenant)
        self._seen[tenant] = (now, found)
        return found

    @property
    def any_partial(self) -> bool:
        """Some tenant's first ingest is not complete (for /readyz, which names no tenant)."""
        now = time.monotonic()
        if now - self._any[0] >= READ_EVERY_S:
            folder = self._data_dir / FOLDER
            self._any = (now, folder.is_dir() and any(folder.glob("*.json")))
        return self._any[1]

    def _read(self, tenant: str) -> PartialIndex | None:
        try:
            entry = json.loads(progress_path(self._data_dir, tenant).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            # Unreadable: the ingest's own file, being replaced or damaged. Still partial.
            return PartialIndex(0, None)
        if not isinstance(entry, dict) or entry.get("tenant") != tenant:
            return None  # another tenant's digest collision: never shown to this one
        done, total = entry.get("done"), entry.get("total")
        if not isinstance(done, int) or not isinstance(total, int):
            return PartialIndex(0, None)
        return PartialIndex(done, total)
