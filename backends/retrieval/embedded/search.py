"""Hybrid search of a tenant's chunks, and reading a document's chunks back.

BM25 by the tenant's own FTS5 table, dense by an exact cosine over the tenant's own vectors,
fused by `base.fuse`. Tenants are isolated in ranking as well as in results: BM25's statistics
(document frequencies, average lengths) come from the tenant's own table, so nothing another
tenant stores moves a tenant's scores or order. (With one shared table, a tenant could learn
whether a word occurs in others' documents from which of its own two documents ranked first.)

Access lists (`document_groups`) filter both arms before their top candidates: the FTS arm's
query excludes the rows of documents the reader may not read before its LIMIT, the dense arm
masks them before its top n, and the statement that reads the hits' text, like a document read
back, checks the reader's groups again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from backends.retrieval.access import Groups
from backends.retrieval.base import (
    ArmRanking,
    FusionMethod,
    Hit,
    SearchRequest,
    document_chunk_limit,
    fuse,
)
from backends.retrieval.embedded.lexical import affordable_terms, fts_expression
from backends.retrieval.embedded.state import IndexState
from backends.retrieval.embedded.store import WEIGHTS

_BM25_WEIGHTS = ", ".join(str(w) for w in WEIGHTS.values())
# The documents of a tenant a reader may not read: those with an access list sharing no group
# with the reader's (`{marks}`: one parameter per group; SQLite takes `IN ()` as false).
# `_READABLE`: the reader may read the document of a `chunks` row (a condition on the row).
_LISTED = "document_groups AS g WHERE g.tenant = chunks.tenant AND g.doc_id = chunks.doc_id"
_READABLE = (
    f"(NOT EXISTS (SELECT 1 FROM {_LISTED})"
    f" OR EXISTS (SELECT 1 FROM {_LISTED} AND g.grp IN ({{marks}})))"
)
_HIDDEN_DOCUMENTS = (
    "SELECT doc_id FROM document_groups WHERE tenant = ? GROUP BY doc_id"
    " HAVING max(grp IN ({marks})) = 0"
)
# The seam's reading order: n of `<doc_id>#<n>` as a number (ids whose n has a non-digit
# last), then the id.
_POSITION = "substr(chunks.chunk_id, length(chunks.doc_id) + 2)"
_READING_ORDER = (
    f"{_POSITION} = '' OR {_POSITION} GLOB '*[^0-9]*', CAST({_POSITION} AS INTEGER),"
    " chunks.chunk_id"
)


@dataclass(frozen=True, slots=True)
class _Ranked:
    """One arm's ranking: chunk row ids best first, with the arm's own scores."""

    ids: list[int]
    scores: dict[int, float]


def search_hits(
    state: IndexState,
    request: SearchRequest,
    terms: Sequence[str],
    default_fusion: FusionMethod,
    row_budget: int | None,
) -> list[Hit]:
    """The request's top k; `terms` are its text's (`lexical.query_terms`), of which FTS5
    scores those `row_budget` affords (`lexical.affordable_terms`)."""
    arms: dict[str, tuple[_Ranked, float]] = {}
    if request.mode != "dense" and terms:
        arms["bm25"] = (_bm25(state, request, terms, row_budget), request.lexical_weight)
    if request.mode != "bm25":
        arms["dense"] = (_dense(state, request), request.dense_weight)
    method = request.fusion or default_fusion
    rankings = [
        ArmRanking([str(i) for i in r.ids], [r.scores[i] for i in r.ids], w)
        for r, w in arms.values()
    ]
    top = [(int(key), score) for key, score in fuse(rankings, method)[: request.k]]
    return _hits(state, request, top, {name: r for name, (r, _) in arms.items()})


def document_chunks(
    state: IndexState, tenant: str, doc_id: str, limit: int, groups: Groups
) -> list[Hit]:
    table = state.fts(tenant)
    if table is None:
        return []
    readable, params = _readable(groups)
    rows = state.db.execute(
        f"SELECT chunks.chunk_id, documents.title, chunks.section, {table}.text"
        " FROM chunks"
        " JOIN documents USING (tenant, doc_id)"
        f" JOIN {table} ON {table}.rowid = chunks.id"
        f" WHERE chunks.tenant = ? AND chunks.doc_id = ? AND {readable}"
        f" ORDER BY {_READING_ORDER} LIMIT ?",
        (tenant, doc_id, *params, document_chunk_limit(limit)),
    )
    return [Hit(doc_id, chunk, title, section, text, 0.0) for chunk, title, section, text in rows]


def _bm25(
    state: IndexState, request: SearchRequest, terms: Sequence[str], row_budget: int | None
) -> _Ranked:
    # The tenant's own table: FTS5 only ever ranks this tenant's rows, with statistics of
    # this tenant's rows only. The join re-checks the tenant column as a second, independent
    # guard. It joins after the LIMIT: joining every match before sorting doubled the time.
    table = state.fts(request.tenant)
    if table is None:
        return _Ranked([], {})
    query = fts_expression(affordable_terms(state, request.tenant, table, terms, row_budget))
    if not query:
        return _Ranked([], {})
    # Rows the reader may not see are out before the LIMIT, so the arm is filled from the rest.
    hidden, params = _hidden_documents(request.tenant, request.groups)
    rows = state.db.execute(
        f"SELECT top.id, top.score FROM (SELECT rowid AS id,"
        f" bm25({table}, {_BM25_WEIGHTS}) AS score FROM {table} WHERE {table} MATCH ?"
        f" AND rowid NOT IN (SELECT id FROM chunks WHERE tenant = ? AND doc_id IN ({hidden}))"
        " ORDER BY score LIMIT ?) AS top"
        " JOIN chunks USING (id) WHERE chunks.tenant = ? ORDER BY top.score",
        (
            f"{{title section text}} : ({query})",
            request.tenant,
            *params,
            request.candidates,
            request.tenant,
        ),
    ).fetchall()
    # FTS5's bm25() is lower-is-better; negate so every arm's score is higher-is-better.
    return _Ranked([r[0] for r in rows], {r[0]: -r[1] for r in rows})


def _hidden_documents(tenant: str, groups: Groups) -> tuple[str, tuple[str, ...]]:
    """The subquery of the tenant's documents a reader in `groups` may not read, and its
    parameters."""
    ordered = tuple(sorted(groups))
    return _HIDDEN_DOCUMENTS.format(marks=",".join("?" * len(ordered))), (tenant, *ordered)


def _readable(groups: Groups) -> tuple[str, tuple[str, ...]]:
    """A condition on a `chunks` row: a reader in `groups` may read its document (no access
    list, or one sharing a group), and its parameters. Two index lookups per row: for the few
    rows a statement returns, not for an arm's every match."""
    ordered = tuple(sorted(groups))
    return _READABLE.format(marks=",".join("?" * len(ordered))), ordered


def _hidden_chunks(state: IndexState, request: SearchRequest) -> list[int]:
    """The row ids of the tenant's chunks the reader may not see."""
    hidden, params = _hidden_documents(request.tenant, request.groups)
    rows = state.db.execute(
        f"SELECT id FROM chunks WHERE tenant = ? AND doc_id IN ({hidden})",
        (request.tenant, *params),
    )
    return [r[0] for r in rows]


def _dense(state: IndexState, request: SearchRequest) -> _Ranked:
    vectors = state.tenant_vectors(request.tenant)
    if vectors is None:
        return _Ranked([], {})
    if request.vector.shape != (vectors.dimension,):
        raise ValueError(
            f"query vector has shape {request.vector.shape}, index holds {vectors.dimension}-d"
        )
    # Read after the vectors: every chunk they hold was committed before this read, so another
    # process's write landing in between can only hide more, never show a hidden chunk.
    hidden = _hidden_chunks(state, request)
    top = vectors.top(request.vector.astype(np.float32, copy=False), request.candidates, hidden)
    return _Ranked([i for i, _ in top], dict(top))


def _hits(
    state: IndexState,
    request: SearchRequest,
    fused: list[tuple[int, float]],
    arms: dict[str, _Ranked],
) -> list[Hit]:
    """The fused chunks' rows. The one statement that reads their text checks the access
    lists again, as of now: a list another process changed since an arm ranked is obeyed."""
    tenant = request.tenant
    table = state.fts(tenant)
    if not fused or table is None:
        return []
    marks = ",".join("?" * len(fused))
    readable, groups = _readable(request.groups)
    rows = state.db.execute(
        "SELECT chunks.id, chunks.doc_id, chunks.chunk_id, documents.title, chunks.section,"
        f" {table}.text FROM chunks"
        " JOIN documents USING (tenant, doc_id)"
        f" JOIN {table} ON {table}.rowid = chunks.id"
        f" WHERE chunks.tenant = ? AND chunks.id IN ({marks}) AND {readable}",
        (tenant, *[i for i, _ in fused], *groups),
    ).fetchall()
    by_id = {r[0]: r for r in rows}
    ranks = {name: {i: n for n, i in enumerate(r.ids, start=1)} for name, r in arms.items()}
    hits = [_hit(by_id[i], score, ranks, arms) for i, score in fused if i in by_id]
    return sorted(hits, key=lambda h: (-h.score, h.chunk_id, h.doc_id))


def _hit(
    row: tuple[int, str, str, str, str, str],
    score: float,
    ranks: dict[str, dict[int, int]],
    arms: dict[str, _Ranked],
) -> Hit:
    chunk = row[0]

    def arm(name: str) -> tuple[int | None, float | None]:
        if name not in arms or chunk not in arms[name].scores:
            return None, None
        return ranks[name][chunk], arms[name].scores[chunk]

    (bm25_rank, bm25_score), (dense_rank, dense_score) = arm("bm25"), arm("dense")
    return Hit(
        doc_id=row[1],
        chunk_id=row[2],
        title=row[3],
        section=row[4],
        text=row[5],
        score=score,
        bm25_rank=bm25_rank,
        dense_rank=dense_rank,
        bm25_score=bm25_score,
        dense_score=dense_score,
    )
