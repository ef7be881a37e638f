"""A first ingest by another process is seen through the data directory: its tenant's answers
say partial_index, no other tenant's do, and a stopped one leaves the index said partial."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from backends.retrieval.base import Vector
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.ingest.background import ingest_shown
from gateway.ingest.progress import IngestProgress, IngestRegistry, PartialIndex, ProgressDisplay
from gateway.ingest.shared_progress import ProgressFile, SharedIngests, progress_path
from tests.unit.test_ingest import FakeEmbedder, docs


def test_a_tenants_file_is_read_for_that_tenant_only(tmp_path: Path) -> None:
    progress = IngestProgress("acme", "documents", state="running", done=3, total=10)
    ProgressFile(tmp_path, progress).update()
    shared = SharedIngests(tmp_path)
    assert shared.partial_index("acme") == PartialIndex(3, 10)
    assert shared.partial_index("globex") is None
    assert shared.any_partial


@pytest.mark.parametrize("tenant", ["../../outside", "/etc/passwd", "a\x00b", "CON", "é" * 300])
def test_any_tenant_id_names_one_file_inside_the_folder(tmp_path: Path, tenant: str) -> None:
    progress = IngestProgress(tenant, "documents", state="running", done=1, total=2)
    writer = ProgressFile(tmp_path, progress)
    writer.update()
    assert writer.path.parent == tmp_path / "ingests"
    assert [p.name for p in (tmp_path / "ingests").iterdir()] == [writer.path.name]
    assert SharedIngests(tmp_path).partial_index(tenant) == PartialIndex(1, 2)


def test_the_reader_looks_at_most_once_a_second_per_tenant(tmp_path: Path) -> None:
    progress = IngestProgress("acme", "documents", state="running", done=3, total=10)
    writer = ProgressFile(tmp_path, progress)
    writer.update()
    shared = SharedIngests(tmp_path)
    assert shared.partial_index("acme") == PartialIndex(3, 10)
    writer.remove()
    assert shared.partial_index("acme") == PartialIndex(3, 10)  # the verdict of the last look
    assert SharedIngests(tmp_path).partial_index("acme") is None


def test_a_file_naming_another_tenant_is_not_shown(tmp_path: Path) -> None:
    path = progress_path(tmp_path, "acme")
    path.parent.mkdir()
    path.write_text(json.dumps({"tenant": "globex", "done": 1, "total": 2}))
    assert SharedIngests(tmp_path).partial_index("acme") is None


def test_the_registry_says_complete_only_when_no_ingest_fills_an_index(tmp_path: Path) -> None:
    registry = IngestRegistry(SharedIngests(tmp_path))
    assert registry.complete and registry.partial_index("acme") is None
    progress = IngestProgress("acme", "documents", state="running", done=1, total=4)
    ProgressFile(tmp_path, progress).update()
    registry = IngestRegistry(SharedIngests(tmp_path))
    assert not registry.complete
    assert registry.partial_index("acme") == PartialIndex(1, 4)
    own = IngestProgress("acme", "sample", state="running", done=2, total=9)
    registry.track(own)  # this process's own ingest is the one it knows best
    assert registry.partial_index("acme") == PartialIndex(2, 9)


class FailsOnSecondCall(FakeEmbedder):
    async def embed(self, texts: Sequence[str]) -> Vector:
        if self.calls:
            raise OSError("embedder gone")
        return await super().embed(texts)


async def test_a_stopped_first_ingest_leaves_its_tenant_said_partial(tmp_path: Path) -> None:
    progress = IngestProgress("acme", "documents", state="running", total=40)
    writer = ProgressFile(tmp_path, progress)
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        with pytest.raises(OSError):
            await ingest_shown(
                progress,
                ProgressDisplay(progress, io.StringIO()),
                docs(40),
                FailsOnSecondCall(),
                index,
                parallel=1,
                shared=writer,
            )
    partial = SharedIngests(tmp_path).partial_index("acme")
    assert partial is not None and partial.total == 40 and partial.done < 40
