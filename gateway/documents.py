"""`PUT` and `DELETE /v1/documents/{doc_id}`: live, tenant-scoped document changes.

The tenant comes from the API key, never from the path or body. A change bumps the tenant's
index generation, which retires every cached answer computed before it.
"""

from __future__ import annotations

import re

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from gateway.appkeys import RUNTIME, SERVICES
from gateway.errors import NotFound, Unprocessable
from gateway.handlers import parse_body
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import RawDocument
from gateway.schemas import NonBlankStr

_DOC_ID = re.compile(r"^[^\x00-\x1f]{1,512}$")
MAX_DOCUMENT_CHARS = 500_000


class DocumentBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    title: str = Field(default="", max_length=1000)
    # Blank text is refused: DELETE is how a document is removed.
    text: NonBlankStr = Field(max_length=MAX_DOCUMENT_CHARS)


def _doc_id(request: web.Request) -> str:
    doc_id = request.match_info["doc_id"]
    if not _DOC_ID.match(doc_id):
        raise Unprocessable("doc_id: 1 to 512 characters, no control characters")
    return doc_id


async def handle_put_document(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    doc_id = _doc_id(request)
    body = await parse_body(request, DocumentBody)
    services = request.app[SERVICES]
    report = await ingest_documents(
        tenant.id,
        [RawDocument(doc_id, body.title or doc_id, body.text)],
        services.embedder,
        services.retriever,
    )
    result = "created" if report.added else "updated" if report.updated else "unchanged"
    generation = await services.retriever.generation(tenant.id)
    return web.json_response(
        {"doc_id": doc_id, "result": result, "chunks": report.chunks, "generation": generation},
        status=201 if result == "created" else 200,
    )


async def handle_delete_document(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    tenant = runtime.tenant_for(request.headers.get("Authorization"))
    doc_id = _doc_id(request)
    services = request.app[SERVICES]
    if not await services.retriever.delete_document(tenant.id, doc_id):
        raise NotFound(f"no document {doc_id!r}")
    generation = await services.retriever.generation(tenant.id)
    return web.json_response({"doc_id": doc_id, "result": "deleted", "generation": generation})
