"""What both evaluations ask of the configured deployment: a configured tenant's flags, the
questions' embeddings, and a tenant index that holds documents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.retrieval.base import Retriever, Vector
from gateway.eval.errors import EvalError
from gateway.settings import Settings

EMBED_BATCH = 64


def tenant_flags(settings: Settings, tenant: str) -> tuple[bool, bool]:
    """(allow_force_route, allow_full_context) of a configured tenant."""
    if not settings.tenants:
        return True, True  # the demo tenant, or any tenant of an unconfigured deployment
    for t in settings.tenants:
        if t.id == tenant:
            return t.allow_force_route, t.allow_full_context
    known = ", ".join(t.id for t in settings.tenants)
    raise EvalError(f"--tenant {tenant}: not a configured tenant ({known})")


async def embed_all(embedder: Any, texts: Sequence[str]) -> Vector:
    parts = [
        await embedder.embed(list(texts[i : i + EMBED_BATCH]))
        for i in range(0, len(texts), EMBED_BATCH)
    ]
    return np.concatenate(parts).astype(np.float32)


async def require_documents(retriever: Retriever, settings: Settings, tenant: str) -> None:
    docs, _ = await retriever.stats(tenant)
    if docs == 0:
        raise EvalError(
            f"tenant {tenant} has no documents in the {retriever.name} index of this "
            f"configuration (data_dir {settings.data_dir}): ingest them first "
            f"(querygate ingest --tenant {tenant} ...)"
        )
