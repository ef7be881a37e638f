"""OpenSearch hybrid retriever: BM25 + k-NN (lucene HNSW), tenant filter inside both arms, fused.

One module per concern: `config` (the `retrieval.opensearch` settings and the names they give),
`client` (the pooled client, errors as the seam's), `layout` (template, aliases, index versions,
meta index, pipeline), `queries` (request bodies and the fusion path), `search` (reads),
`stored`, `bulk`, `generations` and `writes` (replacing documents whole), `migrate` (from the
`shared` tenancy to index per tenant) and `retriever` (the `Retriever` seam over all of them).
"""

from backends.retrieval.opensearch.client import Json
from backends.retrieval.opensearch.config import OpenSearchConfig
from backends.retrieval.opensearch.layout import SharedChunksNotMigrated
from backends.retrieval.opensearch.migrate import migrate_tenancy
from backends.retrieval.opensearch.queries import normalise_query
from backends.retrieval.opensearch.retriever import OpenSearchRetriever

__all__ = [
    "Json",
    "OpenSearchConfig",
    "OpenSearchRetriever",
    "SharedChunksNotMigrated",
    "migrate_tenancy",
    "normalise_query",
]
