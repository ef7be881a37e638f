"""`POST /v1/embeddings`: OpenAI's embeddings endpoint, served by the gateway's own embedder
(the one its retrieval and cache use), for clients that use one base URL for both.

Per tenant like every /v1 endpoint: the key names the tenant, whose rate limit and admission
share this request takes (`gateway.http.middleware.limits`); it spends no model budget (the
embedder has no price). `model` must be the embedder's own name (404 naming it otherwise: a
vector of another model is not what was asked for); `input` is a string or a list of up
to `MAX_EMBEDDING_INPUTS` strings, each cleaned as every client text is and refused when blank
or longer than the encoder's window (a truncated input would be embedded unseen);
`encoding_format` float or base64 (little-endian float32, as OpenAI's); `dimensions` only at
the model's own. Token arrays are not text and are refused.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from aiohttp import web

from backends.embeddings.base import Embedder, token_window
from gateway.core.guard import request_guard
from gateway.errors import BadRequest, NotFound, clip, listed
from gateway.http.appkeys import SCOPE, SERVICES
from gateway.http.body import parse_body
from gateway.http.schemas import EmbeddingBody

# A rough count where the embedder's tokenizer is not known (a remote provider's).
_CHARS_PER_TOKEN = 4


def _refuse_unsupported(body: EmbeddingBody, embedder: Embedder) -> None:
    problems = [
        f"{clip(name)}: not a parameter this endpoint supports"
        for name, value in sorted((body.model_extra or {}).items())
        if value is not None
    ]
    if body.dimensions is not None and body.dimensions != embedder.dimension:
        problems.append(
            f"dimensions: {embedder.model_id} embeds in {embedder.dimension} dimensions only"
        )
    if problems:
        raise BadRequest(listed(problems))


def _tokens(texts: list[str], embedder: Embedder) -> tuple[int, bool]:
    """(tokens in `texts`, estimated); 400 naming each input over the encoder's window."""
    window = token_window(embedder)
    if window is None:
        return sum(-(-len(t) // _CHARS_PER_TOKEN) for t in texts), True
    counts = [window.count(t) for t in texts]
    over = [
        f"input[{i}]: {n} tokens, over the {window.text_tokens} {embedder.model_id} reads"
        for i, n in enumerate(counts)
        if n > window.text_tokens
    ]
    if over:
        raise BadRequest(listed(over))
    return sum(counts) + window.special_tokens * len(texts), False


def _encoded(row: np.ndarray[Any, Any], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in row]


async def handle_embeddings(request: web.Request) -> web.Response:
    scope = request[SCOPE]
    embedder = request.app[SERVICES].embedder
    body = await parse_body(request, EmbeddingBody)
    if body.model != embedder.model_id:
        raise NotFound(
            f"model {clip(body.model)!r} does not exist here; this gateway embeds with "
            f"{embedder.model_id!r}"
        )
    _refuse_unsupported(body, embedder)
    texts = body.texts()
    tokens, estimated = _tokens(texts, embedder)
    async with request_guard(scope.deadline):
        vectors = await embedder.embed(texts)
    scope.record.fields.update(embedding_inputs=len(texts), embedding_tokens=tokens)
    if body.user:
        scope.record.fields["user"] = body.user
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(row, body.encoding_format)}
        for i, row in enumerate(vectors)
    ]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": embedder.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "querygate": {"dimension": embedder.dimension, "usage_estimated": estimated},
        }
    )
