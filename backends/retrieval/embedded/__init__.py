"""The embedded hybrid index: one SQLite file, BM25 by FTS5, exact cosine search in numpy.

No server to run: `querygate serve` with no configuration uses this. Modules: `store` (the
file: schema, per-tenant FTS5 tables, opening and migrating it, transactions, snapshots),
`changes` (the per-tenant change log), `vectors` (a tenant's embeddings in memory), `state`
(what one process holds of the file), `lexical` (query terms and the bound on what FTS5 scores),
`search`, `writes`, `lanes` (per-tenant read lanes on a bounded thread pool) and `retriever`
(the `Retriever` seam: writes on one thread, reads in the lanes).
"""

from backends.retrieval.embedded.lexical import fts_query
from backends.retrieval.embedded.retriever import EmbeddedRetriever
from backends.retrieval.embedded.store import fts_table, tenant_key

__all__ = ["EmbeddedRetriever", "fts_query", "fts_table", "tenant_key"]
