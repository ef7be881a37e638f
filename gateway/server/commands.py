"""The one-shot commands: each builds the backends a configuration names, runs once and
closes them. `gateway/cli` parses their arguments and prints what they return."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from opensearchpy.exceptions import OpenSearchException

from backends.embeddings.bulk import bulk_embedder
from backends.embeddings.config import build_embedder
from backends.retrieval.base import Retriever
from backends.retrieval.opensearch.client import open_client
from backends.retrieval.versions import VersionedIndex, VersionError
from gateway.core.routing import configured_routes, policy_for
from gateway.core.runtime import build_classifier, effective_tenants
from gateway.http.wire import decision_body
from gateway.ingest.background import ingest_shown
from gateway.ingest.progress import IngestProgress, ProgressDisplay
from gateway.ingest.prune import prune_sources
from gateway.ingest.readers import RawDocument, read_paths, source_of
from gateway.ingest.reindex import describe, reindex_tenant
from gateway.ingest.shared_progress import ProgressFile
from gateway.ingest.wiki_sample import load_in_ingest_order
from gateway.server.services import build_retriever, embedded_index_path
from gateway.settings import Settings
from routers.policy import decide

# `querygate ingest --prune`: off, list what it would delete, or delete it (`--prune --apply`).
PruneMode = Literal["off", "dry-run", "apply"]

_SERVE_WITH_IT = (
    "A gateway reads the index its own configuration names: serve with the same configuration "
    "to answer from these documents"
)


async def new_index_notice(settings: Settings) -> str | None:
    """What to say when an ingest is about to create the index itself, where a gateway would
    have made one on start: most often it is not the index a gateway serves (another data_dir,
    QUERYGATE_DATA_DIR, another OpenSearch alias or cluster). None: the index exists."""
    if settings.retrieval.backend == "embedded":
        index = embedded_index_path(settings)
        if index.exists():
            return None
        return (
            f"no index at {index}: creating a new one. A gateway reads the index in its own "
            "data_dir (the configuration's data_dir, relative to its file; QUERYGATE_DATA_DIR; "
            "else $XDG_DATA_HOME/querygate or ~/.local/share/querygate): serve with the same "
            "configuration to answer from these documents"
        )
    config = settings.retrieval.opensearch
    client = open_client(config)
    try:
        # Every gateway's start creates the meta index (`ensure_index`): without it, no gateway
        # has served from this alias on this cluster.
        if await client.indices.exists(index=config.meta_index):
            return None
    except OpenSearchException:
        return None  # the cluster is not answering: the ingest itself says so
    finally:
        await client.close()
    hosts = ", ".join(config.hosts)
    return f"no index {config.alias!r} at {hosts}: creating a new one. {_SERVE_WITH_IT}"


async def ingest(
    settings: Settings,
    tenant: str,
    paths: list[Path],
    sample: bool,
    rechunk: bool = False,
    *,
    source: str | None = None,
    prune: PruneMode = "off",
) -> dict[str, Any]:
    """`querygate ingest`: the documents at `paths` (and the sample corpus) into `tenant`'s
    index, with a progress display; the report, with the ids refused as too large or blank.
    A first ingest of the tenant is shared through the data directory while it runs
    (`gateway.ingest.shared_progress`), so a gateway serving it says its answers are partial.
    Each path is a source (`source_of`: named `source`, else its resolved path); `prune`
    "dry-run" lists the documents of those sources that they no longer have (`stale_ids`),
    "apply" deletes them too."""
    embedder = build_embedder(settings.embeddings)
    retriever = build_retriever(settings, embedder.dimension)
    # Every core embeds (one batch each); this coroutine is the one writer.
    bulk, parallel = bulk_embedder(embedder)
    try:
        docs = load_in_ingest_order() if sample else []
        docs += list(read_paths(paths, source))
        progress = IngestProgress(tenant, "sample corpus" if sample else "documents")
        progress.total, progress.state = len(docs), "running"
        progress.workers = getattr(bulk, "workers", 1)
        display = ProgressDisplay(progress)
        shared = ProgressFile(settings.data_dir, progress)
        first = shared.path.exists() or (await retriever.stats(tenant))[0] == 0
        report = await ingest_shown(
            progress,
            display,
            docs,
            bulk,
            retriever,
            parallel,
            rechunk=rechunk,
            max_chunks=settings.server.max_document_chunks,
            shared=shared if first else None,
        )
        # Every document is in (or refused by name): a stopped ingest leaves the file.
        shared.remove()
        progress.state, progress.chunks = "done", report.chunks
        display.update(final=True)
        pruned = await _prune(tenant, paths, source, docs, retriever, prune)
    finally:
        if bulk is not embedder:
            await bulk.aclose()
        await retriever.aclose()
        await embedder.aclose()
    return {
        **report.as_dict(),
        "too_large_ids": report.too_large_ids,
        "blank_ids": report.blank_ids,
        **pruned,
    }


async def _prune(
    tenant: str,
    paths: list[Path],
    source: str | None,
    docs: list[RawDocument],
    retriever: Retriever,
    mode: PruneMode,
) -> dict[str, Any]:
    """The prune's part of the report; nothing when not asked for."""
    if mode == "off":
        return {}
    # Every source given has an entry: a folder emptied of its files has all of its documents
    # stale (and listed by a dry run first).
    present: dict[str, set[str]] = {source_of(path, source): set() for path in paths}
    for doc in docs:
        if doc.source in present:
            present[doc.source].add(doc.doc_id)
    found = await prune_sources(tenant, present, retriever, apply=mode == "apply")
    return {
        "stale": sum(len(ids) for ids in found.stale.values()),
        "pruned": len(found.deleted),
        "unsourced": found.unsourced,
        "stale_ids": found.stale,
    }


async def reindex(settings: Settings, tenant: str | None, step: str) -> list[dict[str, Any]]:
    """`querygate reindex`: `step` ("build", "status", "rollback", "drop_old", "abort") for
    `tenant`, or every configured tenant (None); one result per tenant, in order. A build
    stops at the first tenant that fails: those before it are switched."""
    embedder = build_embedder(settings.embeddings)
    retriever = build_retriever(settings, embedder.dimension)
    bulk, parallel = bulk_embedder(embedder)
    tenants = [tenant] if tenant is not None else [t.id for t in effective_tenants(settings)]
    try:
        if not isinstance(retriever, VersionedIndex):
            raise VersionError(f"the {retriever.name} backend has no index versions")
        results: list[dict[str, Any]] = []
        for name in tenants:
            if step == "build":
                report = await reindex_tenant(name, retriever, bulk, parallel=parallel)
                results.append(report.as_dict())
                continue
            operation = {
                "status": retriever.versions,
                "rollback": retriever.rollback,
                "drop_old": retriever.drop_previous,
                "abort": retriever.abort_build,
            }[step]
            results.append({"tenant": name, **describe(await operation(name))})
        return results
    finally:
        if bulk is not embedder:
            await bulk.aclose()
        await retriever.aclose()
        await embedder.aclose()


async def explain_route(settings: Settings, tenant: str, question: str) -> dict[str, Any]:
    """`querygate route`: the routing decision for `question`, as `/v1/route` explains it."""
    embedder = build_embedder(settings.embeddings)
    try:
        vector = (await embedder.embed([question]))[0]
    finally:
        await embedder.aclose()
    classifier = build_classifier(settings, embedder.model_id)
    policy = policy_for(settings, tenant, configured_routes(settings))
    classification = classifier.classify(question, vector)
    return decision_body(decide(classification, "auto", question, policy))
