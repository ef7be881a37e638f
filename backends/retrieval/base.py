"""The retrieval seam: what a hybrid index must do for the gateway.

Contract shared by every implementation:
- Every read and write names a tenant, and the tenant filter is applied *inside* both the
  lexical and the dense query, never after them: a tenant can never receive another's chunk.
- `search(mode="hybrid")` fuses the BM25 and k-NN rankings by `SearchRequest.fusion` (None: the
  retriever's configured method), ties broken by chunk id (`fuse`):
  - "rrf": score = sum over arms of weight / (rrf_k + rank), rank starting at 1;
  - "minmax": each arm's scores scaled to [0, 1] over its own candidates (best 1, worst
    MINMAX_FLOOR = 0.001 as neural-search's normalization-processor has it, an arm whose
    candidates all score alike gives 1), score = sum of weight x scaled score, an arm that
    missed the chunk adding 0; times 1 / (rrf_k + 1), so that a chunk both arms rank first
    scores what it does under RRF, (lexical_weight + dense_weight) / (rrf_k + 1), which is the
    scale `routers.grading` reads agreement on;
  - "minmax_peak" (the default): "minmax" with each arm's weight first multiplied by
    1 + PEAK_WEIGHT x its peak, the margin of its best candidate over its second in scaled
    scores (0 when they tie, 1 for a lone candidate), then all weights rescaled to keep their
    sum: an arm that singles one chunk out (BM25 on a rare identifier) counts more than one
    whose top candidates are near-equal (the dense arm on a query it does not understand).
    A chunk both arms rank first still scores (lexical_weight + dense_weight) / (rrf_k + 1);
  - "zscore": as "minmax" with each arm's scores standardised (mean 0, sd 1; sd 0 gives 0) and
    an arm that missed the chunk adding its lowest standardised score.
- `document_chunks` reads one document back in reading order: by the n of its chunk ids
  `<doc_id>#<n>` as a number (#10 follows #9), ids whose n is not a number last, then by id.
- Writes are per document: `upsert_document` replaces all of a document's chunks and is a no-op
  when the content hash is unchanged; every change bumps the tenant's generation, which cached
  answers are keyed on, once the change is visible. Whether readers can see old and new chunks
  together is the backend's to state: never in the embedded index (one transaction); in
  OpenSearch for milliseconds while a write is applied, and until a settling write when two
  processes write one document at once (docs/opensearch.md). A write that failed is never taken
  for a stored one: retrying it writes again (or makes a generation bump that was lost) and
  converges on the new version. A document without chunks is refused with `EmptyDocument`
  (DELETE is how a document is removed), before anything of its batch is written.
- Document-level access (`backends.retrieval.access`): a document may carry an access list
  (`Document.groups`), and every read names its reader's groups (`SearchRequest.groups`, the
  `groups` of `document_chunks`). A reader sees a document without a list, or one whose list
  shares a group with it, and nothing else: like the tenant filter, the access filter is
  applied inside both arms before their top candidates are taken, so top-k is filled from what
  the reader may see. BM25 statistics still count every chunk of the tenant (docs/access.md).
- Provenance: every document records the source it was written from (`Document.source`: a
  folder or jsonl `querygate ingest` read, "" for one PUT by the API or written before sources
  were recorded). `set_source` changes only that record (no chunk is rewritten, no generation
  bumped: no answer changes); `source_documents` lists a source's documents, which is what
  `querygate ingest --prune` compares against the source.
- Tenancy of statistics: what one tenant stores never changes another tenant's ranking where a
  backend isolates tenants (embedded always; OpenSearch with `tenancy: index_per_tenant`).
- Failures of the underlying service surface as `backends.errors.BackendUnavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from backends.retrieval.access import NO_GROUPS, Groups

RetrievalMode = Literal["hybrid", "bm25", "dense"]
FusionMethod = Literal["rrf", "minmax", "zscore", "minmax_peak"]
# The gateway's default (`retrieval.fusion`), chosen by bench/retrieval_eval.py on its tuning
# split: the highest worst-case margin over the better single arm, recall@10 and MRR@10, across
# both benchmarks and backends (docs/opensearch.md, "Fusion").
DEFAULT_FUSION: FusionMethod = "minmax_peak"
# How much an arm's peak (its best candidate's margin over its second) raises its weight under
# "minmax_peak": 2 was chosen on the tuning split (1 and 4 within 0.002 of it everywhere).
PEAK_WEIGHT = 2.0
# Scaled score of an arm's lowest candidate under min-max: not 0, so it still counts for more
# than a miss. neural-search's normalization-processor does the same, so the server-side
# pipeline (docs/opensearch.md) ranks as `fuse` does.
MINMAX_FLOOR = 0.001
Vector = npt.NDArray[np.float32]


class EmptyDocument(ValueError):
    """A document that yields no chunk (blank, or headings only): there is nothing to index.

    Raised by `upsert_document(s)` before any write; the gateway answers 422."""

    def __init__(self, doc_id: str) -> None:
        super().__init__(f"{doc_id}: the document has no text to index (0 chunks)")
        self.doc_id = doc_id


RRF_K = 60
MAX_DOC_ID_CHARS = 512  # the longest document id the gateway accepts (HTTP, CLI, agent tools)
# Most chunks one `document_chunks` call returns: enough to read on, small enough for a prompt.
MAX_DOCUMENT_CHUNKS = 200


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrievable passage of a document, with the context needed to cite it."""

    chunk_id: str
    text: str
    section: str
    embedding: Vector


@dataclass(frozen=True, slots=True)
class Document:
    """A whole document as ingested: its chunks replace any earlier version's chunks."""

    doc_id: str
    title: str
    content_hash: str
    chunks: tuple[Chunk, ...]
    # The groups that may read it (`backends.retrieval.access.access_list`); None: every user
    # of the tenant.
    groups: tuple[str, ...] | None = None
    source: str = ""  # where it was ingested from ("": PUT by the API; see the module doc)
    # The text the chunks were made from, kept beside them so that `querygate reindex` can chunk
    # and embed the document again with no source folder; "" when the caller has none.
    text: str = ""


@dataclass(frozen=True, slots=True)
class Hit:
    """One fused search result. Ranks are 1-based per arm; None when that arm missed it."""

    doc_id: str
    chunk_id: str
    title: str
    section: str
    text: str
    score: float
    bm25_rank: int | None = None
    dense_rank: int | None = None
    bm25_score: float | None = None
    dense_score: float | None = None


@dataclass(frozen=True, slots=True)
class SearchRequest:
    tenant: str
    text: str
    vector: Vector
    k: int = 8
    mode: RetrievalMode = "hybrid"
    # Fusion weights per arm; the policy raises lexical_weight for identifier or keyword queries.
    lexical_weight: float = 1.0
    dense_weight: float = 1.0
    # How deep each arm ranks before fusion.
    candidates: int = 50
    extra: dict[str, str] = field(default_factory=dict)
    # How the two arms are fused; None: the retriever's configured method (`retrieval.fusion`).
    fusion: FusionMethod | None = None
    # The reader's groups: only documents they may read are ranked (none: public ones only).
    groups: Groups = NO_GROUPS


class Retriever(Protocol):
    """A tenant-scoped hybrid index."""

    name: str

    async def search(self, request: SearchRequest) -> list[Hit]:
        """Top `request.k` hits for the tenant, best first."""
        ...

    async def document_chunks(
        self, tenant: str, doc_id: str, limit: int = 50, groups: Groups = NO_GROUPS
    ) -> list[Hit]:
        """The document's chunks in reading order (first `limit`, clamped to
        1..MAX_DOCUMENT_CHUNKS), empty when the tenant has no such document or a reader in
        `groups` may not read it: another tenant's document of the same id is never read.

        Hits carry score 0.0 and no ranks: they were read, not ranked.
        """
        ...

    async def upsert_document(self, tenant: str, document: Document) -> bool:
        """Store or replace a document; False when its content hash was already stored."""
        ...

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        """`upsert_document` for many at once, in as few round trips as the engine allows;
        one result per document, in order. Bulk ingest goes through here."""
        ...

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        """Remove every chunk of a document; False when readers saw none of it (leftovers of
        a failed write are still removed)."""
        ...

    async def content_hash(self, tenant: str, doc_id: str) -> str | None:
        """The stored content hash of a document, for idempotent ingest."""
        ...

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        """Stored content hashes of those documents that exist, in one lookup."""
        ...

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        """The recorded source of those documents that exist ("" for none), in one lookup."""
        ...

    async def set_source(self, tenant: str, doc_ids: Sequence[str], source: str) -> None:
        """Record `source` as where those documents (the ones that exist) come from."""
        ...

    async def source_documents(self, tenant: str, source: str) -> list[str]:
        """The ids of the tenant's documents recorded with `source`, sorted."""
        ...

    async def generation(self, tenant: str) -> int:
        """A counter that grows with every change to the tenant's documents."""
        ...

    async def stats(self, tenant: str) -> tuple[int, int]:
        """(documents, chunks) stored for the tenant."""
        ...

    async def ping(self) -> str | None:
        """Raise BackendUnavailable when the index cannot serve queries; a short note when it
        serves them in full but short of its redundancy (a cluster with a node down); None when
        it is whole."""
        ...

    async def aclose(self) -> None: ...


def refuse_empty(documents: Sequence[Document]) -> None:
    """Raise `EmptyDocument` for the first document of `documents` that has no chunk."""
    for document in documents:
        if not document.chunks:
            raise EmptyDocument(document.doc_id)


def document_chunk_limit(limit: int) -> int:
    """`limit` of `Retriever.document_chunks` clamped to 1..MAX_DOCUMENT_CHUNKS."""
    return max(1, min(limit, MAX_DOCUMENT_CHUNKS))


def rrf_fuse(
    rankings: list[tuple[list[str], float]], rrf_k: int = RRF_K
) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of several rankings of ids, each with its weight.

    Returns (id, fused score) best first; ties broken by id so results are deterministic.
    """
    scores: dict[str, float] = {}
    for ids, weight in rankings:
        for rank, item in enumerate(ids, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (rrf_k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass(frozen=True, slots=True)
class ArmRanking:
    """One arm's candidates, best first, with the arm's own higher-is-better scores."""

    ids: Sequence[str]
    scores: Sequence[float]
    weight: float = 1.0


def fuse(
    arms: Sequence[ArmRanking], method: FusionMethod, rrf_k: int = RRF_K
) -> list[tuple[str, float]]:
    """Fuse the arms' rankings by `method` (see the module docstring): (id, score) best first,
    ties broken by id. The one implementation both backends' client-side paths call."""
    if method == "rrf":
        return rrf_fuse([(list(a.ids), a.weight) for a in arms], rrf_k)
    if method == "minmax_peak":
        arms = peak_weighted(arms)
    scores: dict[str, float] = {}
    floors = 0.0  # what the arms add for a chunk none of them found; only chunks found count
    normalised: list[tuple[ArmRanking, dict[str, float], float]] = []
    for arm in arms:
        values = _zscores(arm.scores) if method == "zscore" else _minmax(arm.scores)
        missing = 0.0 if method != "zscore" or not values else min(values)
        normalised.append((arm, dict(zip(arm.ids, values, strict=True)), missing))
        floors += arm.weight * missing
    for _, by_id, _ in normalised:
        for item in by_id:
            scores.setdefault(item, floors)
    for arm, by_id, missing in normalised:
        for item in scores:
            scores[item] += arm.weight * (by_id.get(item, missing) - missing)
    scale = 1.0 / (rrf_k + 1)
    return sorted(((i, s * scale) for i, s in scores.items()), key=lambda kv: (-kv[1], kv[0]))


def peak(scores: Sequence[float]) -> float:
    """How decisively an arm's best candidate leads: best minus second in min-max scaled scores,
    in [0, 1]; 1 for a lone candidate, 0 for none. Scores are best first."""
    if not scores:
        return 0.0
    if len(scores) == 1:
        return 1.0
    low, high = min(scores), max(scores)
    return 0.0 if high == low else max(0.0, (scores[0] - scores[1]) / (high - low))


def peak_weighted(arms: Sequence[ArmRanking], peak_weight: float = PEAK_WEIGHT) -> list[ArmRanking]:
    """The arms with each weight times 1 + peak_weight x `peak`, rescaled to the same sum."""
    raised = [a.weight * (1.0 + peak_weight * peak(a.scores)) for a in arms]
    total, new_total = sum(a.weight for a in arms), sum(raised)
    factor = total / new_total if new_total > 0 else 0.0
    return [ArmRanking(a.ids, a.scores, w * factor) for a, w in zip(arms, raised, strict=True)]


def _minmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high == low:
        return [1.0] * len(scores)
    return [max((s - low) / (high - low), MINMAX_FLOOR) for s in scores]


def _zscores(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    values = np.asarray(scores, dtype=np.float64)
    sd = float(values.std())
    if sd == 0.0:
        return [0.0] * len(scores)
    return [float(v) for v in (values - values.mean()) / sd]
