"""`PUT` and `DELETE /v1/documents/{doc_id}`: live, tenant-scoped document changes.

The tenant comes from the API key, never from the path or body. A change bumps the tenant's
index generation, which retires every cached answer computed before it.

One id, one document: the id is the path after `/v1/documents/`, percent-decoded exactly once
and canonical (`gateway.text.canonical_doc_id`, the rules the CLI's ingest applies too), so
every spelling of it reaches the same document and the answer names it canonically; an id
breaking a rule is refused with 422 naming it, and so is a blank text or a title sent blank
(`gateway.text.is_blank`). A document with no passage (headings only) is refused with 422
before anything is written, and one making more than `server.max_document_chunks` chunks with
413 before any embedding (the stored version stays).

`groups` is the document's access list (`backends.retrieval.access`): left out (or null), every
user of the tenant may read it. A list breaking a rule (not a list of strings, empty, too many
groups, a blank, overlong or control-character name) is refused with 422 naming `groups`.
A change of the list alone is a new version: the document is written again.
"""

from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict

from backends.retrieval.access import access_list
from backends.retrieval.base import EmptyDocument
from gateway.errors import NotFound, PayloadTooLarge, Unprocessable
from gateway.http.appkeys import RUNTIME, SCOPE, SERVICES
from gateway.http.body import parse_body
from gateway.http.schemas import NonBlankStr, sent_at_most
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.readers import RawDocument
from gateway.text import InvalidText, canonical_doc_id, clean_text, is_blank

MAX_DOCUMENT_CHARS = 500_000


def _title(value: object) -> object:
    """A title sent must say something: one that is blank once cleaned (white space, invisible
    or control characters only; the rule the text obeys) would be stored and shown as a
    citation's title that shows nothing. Leaving it out, or "", names the document by its id."""
    if not isinstance(value, str) or value == "":
        return value  # the strict type check refuses a non-string
    cleaned = clean_text(value)
    if is_blank(cleaned):
        raise ValueError(
            "must not be blank (white space or invisible characters only); leave it out to "
            "use the document id"
        )
    return cleaned


def _groups(value: object) -> object:
    """The access list, checked by the rule the CLI's ingest applies (`access_list`)."""
    return None if value is None else access_list(value)


class DocumentBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    title: Annotated[str, BeforeValidator(_title), sent_at_most(1000)] = ""
    # Blank text is refused: DELETE is how a document is removed.
    text: Annotated[NonBlankStr, sent_at_most(MAX_DOCUMENT_CHARS)]
    groups: Annotated[tuple[str, ...] | None, BeforeValidator(_groups)] = None


def _doc_id(request: web.Request) -> str:
    # The raw path, not aiohttp's decoded match: it decodes some escapes and keeps others
    # (invalid UTF-8), and a decoded `%2F` can no longer be told from a `/`.
    _, _, _, raw = request.rel_url.raw_path.split("/", 3)  # "", "v1", "documents", the id
    try:
        return canonical_doc_id(raw)
    except InvalidText as exc:
        raise Unprocessable(str(exc)) from exc


async def handle_put_document(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    tenant = request[SCOPE].tenant
    doc_id = _doc_id(request)
    body = await parse_body(request, DocumentBody)
    services = request.app[SERVICES]
    max_chunks = runtime.settings.server.max_document_chunks
    report = await ingest_documents(
        tenant.id,
        [RawDocument(doc_id, body.title or doc_id, body.text, body.groups)],
        services.embedder,
        services.retriever,
        max_chunks=max_chunks,
    )
    if report.too_large:
        # Each chunk costs the shared embedder about the same, and dense text (punctuation,
        # symbols, code) makes several times the chunks of prose per byte.
        raise PayloadTooLarge(
            f"text: makes more than {max_chunks} chunks to index (server.max_document_chunks); "
            "split the document, or send less punctuation-dense text"
        )
    if report.empty:
        # Skipped by the ingest before any embedding or write (the stored version, if any,
        # stays); the outcome middleware answers it as the backend's refusal: 422.
        raise EmptyDocument(doc_id)
    result = "created" if report.added else "updated" if report.updated else "unchanged"
    generation = await services.retriever.generation(tenant.id)
    return web.json_response(
        {"doc_id": doc_id, "result": result, "chunks": report.chunks, "generation": generation},
        status=201 if result == "created" else 200,
    )


async def handle_delete_document(request: web.Request) -> web.Response:
    tenant = request[SCOPE].tenant
    doc_id = _doc_id(request)
    services = request.app[SERVICES]
    if not await services.retriever.delete_document(tenant.id, doc_id):
        raise NotFound(f"no document {doc_id!r}")
    generation = await services.retriever.generation(tenant.id)
    return web.json_response({"doc_id": doc_id, "result": "deleted", "generation": generation})
