"""The rerank seam: a query and its candidate passages in, one relevance score per passage out.

A reranker is the retrieval's second stage. The first stage (BM25 + k-NN, fused) is cheap and
recalls well; a cross-encoder reads the query and each passage together and orders the top of
that list better, at one forward pass per candidate. Whether a query pays for it is the
gateway's decision (the rerank policy), not the reranker's.

Contract shared by every implementation:
- `scores` returns exactly one float per passage, in the passages' order; higher is more
  relevant. Scores are comparable within one call only (a cross-encoder's logits, a remote
  API's relevance scores), never across calls or implementations.
- An empty `passages` returns `[]` without any work.
- A reranker that cannot answer (a remote API down, the cluster's model undeployed) raises
  `backends.errors.BackendUnavailable`; the caller keeps the fused order.
- `deadline` is an absolute `time.monotonic()` instant the call must not outlive, or None.
- A reranker that is paid per call (a remote API) reports each answered call's price in USD
  to `on_cost`, once, before `scores` returns; the caller charges it to `tenant`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

RerankerKind = Literal["local", "remote", "opensearch"]


@dataclass(frozen=True, slots=True)
class RerankRequest:
    tenant: str  # whose request this is: the remote reranker's cost is metered to it
    query: str
    passages: Sequence[str]
    deadline: float | None = None
    # Hears the price of each answered call (USD); None: the caller does not account for it.
    on_cost: Callable[[float], None] | None = field(default=None, compare=False)


class Reranker(Protocol):
    kind: RerankerKind
    # Names the model in metrics and `debug` (e.g. the local artifact's digest, a remote model).
    model_id: str

    async def scores(self, request: RerankRequest) -> list[float]:
        """One relevance score per passage, in order; higher is more relevant."""
        ...

    async def aclose(self) -> None: ...
