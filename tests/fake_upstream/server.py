"""A fake OpenAI-compatible upstream for tests: deterministic answers, scripted faults.

Run it as its own process (``python -m tests.fake_upstream --host 127.0.0.1 --port 0``); it
prints ``fake-upstream ready on http://HOST:PORT`` once it accepts connections.

Endpoints
---------
``POST /v1/chat/completions``  non-streaming (with ``usage``) or ``stream: true`` (SSE chunks in
                              OpenAI's format, a usage chunk when ``stream_options.include_usage``
                              is set, then ``data: [DONE]``); tool calls in the message or deltas.
``POST /v1/embeddings``        deterministic unit vectors from a hash of each input (float or
                              base64), with usage; ``dimensions`` honoured (default 384).
``POST /v1/rerank``            Cohere's rerank shape (what litellm's ``arerank`` sends for a
                              ``cohere/…`` model with an ``api_base``): each document scored by
                              token overlap, the share of the query's words (lowercased, the
                              directive stripped) that the document holds, ties by index;
                              ``results`` best first (``top_n`` honoured), ``meta.billed_units``
                              ``{"search_units": 1}`` unless the directive's ``billed_units``.
``GET  /health``               ``{"status": "ok"}``.
``GET|POST /admin/stats``      request counts: total, by endpoint, model, status and key; and
                              ``params_by_key``: the parameters (all but ``messages``) of the
                              last chat request carrying each key, as received;
                              ``traceparents_by_key``: the W3C ``traceparent`` header of each
                              chat request carrying each key (null when it had none), in order;
                              ``header_names_by_key``: those requests' header names, lower case.

Scripting, chosen per request
-----------------------------
A directive is a JSON object given in the header ``x-fake`` and/or inside the last user message
(chat) or any input (embeddings) as ``[[fake:{...}]]``; the message one wins key by key, and it is
stripped from the text before the default answer echoes it. Keys, all optional:

``key``            str   names this logical request; counted in ``/admin/stats`` ``by_key`` and
                         used by ``fail_first`` (use a fresh key per test: no reset needed).
``models``         list  apply the faults and scripts only when the request's model is listed
                         (e.g. fail the primary, let the fallback answer). Counted either way.
``status``         int   answer with this HTTP status and an OpenAI-style error body.
``fail_first``     int   the first N applying requests with this ``key`` fail with ``status``
                         (default 503); later ones succeed.
``delay_ms``       int   sleep before the first byte (before the response headers).
``chunk_delay_ms`` int   sleep before each streamed chunk.
``malformed``      bool  HTTP 200 with a body (or SSE data line) that is not valid JSON.
``billed_units``   obj   rerank: the ``meta.billed_units`` to report.
``raw``            obj   HTTP 200 with exactly this JSON body; streamed, each element of it (a
                         list) as one SSE data line, then ``[DONE]`` (odd shapes, valid JSON).
``truncate_after`` int   stream: after N content chunks drop the connection mid-body.
``eof_after``      int   stream: after N content chunks end the body cleanly, with neither a
                         finish_reason nor ``data: [DONE]`` (a stream cut at a clean boundary).
``answer``         str   the answer text (default: ``FAKE ANSWER: <first 60 chars of the last
                         user message>``, plus `` [<id>]`` citing the first source the request
                         delimits as ``<source id="<id>">``, in a system or tool message, the
                         way querygate issues sources). ``{cite:N}`` in it becomes the marker of
                         source N of the request (``[<tag>-N]``, the tag read from the request's
                         ``<source id="<tag>-…">``), or ``[N]`` when the request has no sources.
``tool_calls``     list  ``[{"name": str, "arguments": obj|str, "id"?: str}]``; a string
                         ``arguments`` is sent verbatim (so invalid JSON can be scripted).
``usage``          obj   ``{"prompt_tokens", "completion_tokens"}`` (default: word counts).
``no_usage``       bool  omit ``usage`` from the body, or the usage chunk even when asked for.
``turns``          list  per-turn directives for a tool-calling loop: turn N is the request with
                         N assistant messages after the last user message; an entry overrides
                         the directive key by key, and turns past the list use its last entry.
``final``          obj   overrides the directive for a request that offers no ``tools`` (a loop's
                         forced final answer), whatever its turn.
``flood_bytes``    int   ignore ``max_tokens`` and answer about N bytes of words (finish_reason
                         ``stop``): one JSON body written in pieces, or streamed as content
                         chunks of about 1 KB each. ``/admin/stats`` ``flood_sent_by_key`` counts
                         the bytes written before the client stopped reading.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import math
import re
import struct
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

DIRECTIVE_RE = re.compile(r"\[\[fake:(\{.*?\})\]\]", re.DOTALL)
SOURCE_ID_RE = re.compile(r'<source id="(([^"\s]+)-\d+)"')
CITE_RE = re.compile(r"\{cite:(\d+)\}")
DEFAULT_EMBED_DIM = 384
MODELS = ("fake-small", "fake-large", "fake-fallback", "fake-embed")


@dataclass
class Stats:
    """Counters shared by all requests; tests read them, scoped by their own ``key``."""

    total: int = 0
    by_endpoint: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    by_status: Counter[int] = field(default_factory=Counter)
    by_key: Counter[str] = field(default_factory=Counter)
    # attempts per key that the directive applied to: what fail_first counts against
    applied_by_key: Counter[str] = field(default_factory=Counter)
    # the last chat request's parameters per key: proof of what reached the upstream
    params_by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    # bytes of a `flood_bytes` reply written per key, until the client stopped reading
    flood_sent_by_key: Counter[str] = field(default_factory=Counter)
    # the trace context each chat request carrying a key came with: proof of propagation
    traceparents_by_key: dict[str, list[str | None]] = field(default_factory=dict)
    # the header names (lower case) of each chat request carrying a key: what reached the wire
    header_names_by_key: dict[str, list[list[str]]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_endpoint": dict(self.by_endpoint),
            "by_model": dict(self.by_model),
            "by_status": {str(k): v for k, v in self.by_status.items()},
            "by_key": dict(self.by_key),
            "params_by_key": self.params_by_key,
            "flood_sent_by_key": dict(self.flood_sent_by_key),
            "traceparents_by_key": self.traceparents_by_key,
            "header_names_by_key": self.header_names_by_key,
        }


STATS_KEY = web.AppKey("stats", Stats)


def _content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _parse_directive(header: str | None, text: str) -> dict[str, Any]:
    """Header directive, overridden key by key by one embedded in the text."""
    directive: dict[str, Any] = {}
    if header:
        directive.update(json.loads(header))
    for match in DIRECTIVE_RE.finditer(text):
        directive.update(json.loads(match.group(1)))
    return directive


def _for_turn(body: dict[str, Any], directive: dict[str, Any]) -> dict[str, Any]:
    """The directive of this turn of an agent loop (see ``turns`` and ``final``)."""
    if "final" in directive and not body.get("tools"):
        # a request offering no tools gets none, whatever the rest of the script says
        rest = {k: v for k, v in directive.items() if k not in ("turns", "tool_calls")}
        return {**rest, **directive["final"]}
    messages: list[dict[str, Any]] = body.get("messages") or []
    turns = directive.get("turns")
    if not turns:
        return directive
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    turn = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant")
    return {**directive, **turns[min(turn, len(turns) - 1)]}


def _strip_directive(text: str) -> str:
    return DIRECTIVE_RE.sub("", text).strip()


def _word_count(text: str) -> int:
    return len(text.split())


def _error(status: int, message: str) -> web.Response:
    kind = "rate_limit_error" if status == 429 else "fake_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
    return web.json_response(body, status=status)


def _record(request: web.Request, endpoint: str, model: str, directive: dict[str, Any]) -> None:
    stats = request.app[STATS_KEY]
    stats.total += 1
    stats.by_endpoint[endpoint] += 1
    stats.by_model[model] += 1
    if key := directive.get("key"):
        stats.by_key[str(key)] += 1


def _applies(directive: dict[str, Any], model: str) -> bool:
    models = directive.get("models")
    return not models or model in models


async def _scripted_failure(request: web.Request, directive: dict[str, Any]) -> web.Response | None:
    """Delay, then the scripted error response if this attempt should fail."""
    if delay_ms := directive.get("delay_ms"):
        await asyncio.sleep(delay_ms / 1000)
    stats = request.app[STATS_KEY]
    key = str(directive.get("key", ""))
    stats.applied_by_key[key] += 1
    if "fail_first" in directive:
        if stats.applied_by_key[key] <= int(directive["fail_first"]):
            return _error(int(directive.get("status", 503)), "scripted failure (fail_first)")
        return None
    if "status" in directive:
        return _error(int(directive["status"]), "scripted failure")
    return None


def _default_answer(messages: list[dict[str, Any]]) -> str:
    last_user = next(
        (_content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
        "",
    )
    answer = f"FAKE ANSWER: {_strip_directive(last_user)[:60]}"
    source = _first_source(messages)
    if source is not None:
        answer += f" [{source.group(1)}]"
    return answer


def _first_source(messages: list[dict[str, Any]]) -> re.Match[str] | None:
    """The first ``<source id="…">`` of the request's system and tool messages."""
    for m in messages:
        text = _content_text(m.get("content")) if m.get("role") in ("system", "tool") else ""
        if found := SOURCE_ID_RE.search(text):
            return found
    return None


def _cite(text: str, messages: list[dict[str, Any]]) -> str:
    """``{cite:N}`` as the request's marker of source N (``[N]`` without sources)."""
    source = _first_source(messages)
    tag = source.group(2) if source is not None else None
    return CITE_RE.sub(lambda m: f"[{tag}-{m.group(1)}]" if tag else f"[{m.group(1)}]", text)


def _tool_calls(directive: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(directive.get("tool_calls", [])):
        args = call.get("arguments", {})
        calls.append(
            {
                "id": call.get("id", f"call_{i}"),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return calls


@dataclass(frozen=True)
class Reply:
    """What one chat request answers, before it is shaped as a body or a stream."""

    model: str
    text: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    usage: dict[str, int]
    id: str = field(default_factory=lambda: f"chatcmpl-fake-{time.monotonic_ns()}")
    created: int = field(default_factory=lambda: int(time.time()))


def _build_reply(body: dict[str, Any], directive: dict[str, Any]) -> Reply:
    messages: list[dict[str, Any]] = body.get("messages", [])
    if "answer" in directive:
        text = _cite(str(directive["answer"]), messages)
    else:
        text = _default_answer(messages)
    tool_calls = _tool_calls(directive)
    finish_reason = "tool_calls" if tool_calls else "stop"
    # max_tokens truncates like a real model does, so callers can see finish_reason="length"
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    if limit and _word_count(text) > int(limit):
        text = " ".join(text.split()[: int(limit)])
        finish_reason = "length"
    prompt_words = sum(_word_count(_content_text(m.get("content"))) for m in messages)
    completion_words = _word_count(text) + sum(
        _word_count(c["function"]["arguments"]) for c in tool_calls
    )
    usage = {"prompt_tokens": max(prompt_words, 1), "completion_tokens": max(completion_words, 1)}
    usage.update(directive.get("usage", {}))
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return Reply(body.get("model", ""), text, tool_calls, finish_reason, usage)


def _completion_body(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": reply.usage,
    }


def _chunk(reply: Reply, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    body = {
        "id": reply.id,
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": reply.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def _stream_chunks(reply: Reply, include_usage: bool) -> list[bytes]:
    """Every SSE event of a well-formed stream, in order."""
    words = reply.text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)] if reply.text else []
    chunks = [_chunk(reply, {"role": "assistant", "content": ""})]
    chunks += [_chunk(reply, {"content": p}) for p in pieces]
    for i, call in enumerate(reply.tool_calls):
        # OpenAI streams the name first, then the arguments in fragments
        head = {"index": i, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        chunks.append(_chunk(reply, {"tool_calls": [head]}))
        args = call["function"]["arguments"]
        for start in range(0, len(args), 16):
            frag = {"index": i, "function": {"arguments": args[start : start + 16]}}
            chunks.append(_chunk(reply, {"tool_calls": [frag]}))
    chunks.append(_chunk(reply, {}, reply.finish_reason))
    if include_usage:
        usage_body = {
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "choices": [],
            "usage": reply.usage,
        }
        chunks.append(f"data: {json.dumps(usage_body)}\n\n".encode())
    chunks.append(b"data: [DONE]\n\n")
    return chunks


async def _stream(
    request: web.Request, reply: Reply, directive: dict[str, Any], include_usage: bool
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if directive.get("malformed"):
        await response.write(b"data: {this is not json\n\n")
        await response.write_eof()
        return response
    if "raw" in directive:
        for line in directive["raw"]:
            await response.write(f"data: {json.dumps(line)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    chunk_delay = directive.get("chunk_delay_ms", 0) / 1000
    truncate_after = directive.get("truncate_after")
    eof_after = directive.get("eof_after")
    for n, chunk in enumerate(_stream_chunks(reply, include_usage)):
        if eof_after is not None and n > int(eof_after):
            break
        if truncate_after is not None and n > int(truncate_after):
            # close mid-body: the client sees an incomplete chunked read, as on a dropped link
            if request.transport is not None:
                request.transport.close()
            return response
        if chunk_delay:
            await asyncio.sleep(chunk_delay)
        await response.write(chunk)
    await response.write_eof()
    return response


FLOOD_PIECE = "flood " * 170  # about 1 KB of words


async def _flood(
    request: web.Request, body: dict[str, Any], directive: dict[str, Any]
) -> web.StreamResponse:
    """About `flood_bytes` of words whatever `max_tokens` says, written piece by piece (the fake
    never holds the reply whole), until the client stops reading."""
    reply = Reply(str(body.get("model", "")), "", [], "stop", {})
    streamed = bool(body.get("stream"))
    kind = "text/event-stream" if streamed else "application/json"
    response = web.StreamResponse(headers={"Content-Type": kind})
    await response.prepare(request)
    stats, key = request.app[STATS_KEY], str(directive.get("key", ""))
    pieces = -(-int(directive["flood_bytes"]) // len(FLOOD_PIECE))
    if streamed:
        opening = _chunk(reply, {"role": "assistant", "content": ""})
        # numbered: litellm fails a stream that repeats one chunk over and over
        chunks: Iterable[bytes] = (
            _chunk(reply, {"content": f"{n} {FLOOD_PIECE}"}) for n in range(pieces)
        )
        closing = _chunk(reply, {}, "stop") + b"data: [DONE]\n\n"
    else:
        head = _completion_body(reply)
        head["choices"][0]["message"]["content"] = "@@"
        opening, closing = (part.encode() for part in json.dumps(head).split("@@"))
        chunks = (FLOOD_PIECE.encode() * 64 for _ in range(-(-pieces // 64)))
    try:
        for data in itertools.chain((opening,), chunks, (closing,)):
            await response.write(data)
            stats.flood_sent_by_key[key] += len(data)
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass  # the client stopped reading: what it took is counted
    return response


async def _read_json(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await _read_json(request)
    if body is None:
        return _error(400, "body is not a JSON object")
    messages = body.get("messages") or []
    last_user = next(
        (_content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
        "",
    )
    try:
        directive = _for_turn(body, _parse_directive(request.headers.get("x-fake"), last_user))
    except json.JSONDecodeError as exc:
        return _error(400, f"bad fake directive: {exc}")
    model = str(body.get("model", ""))
    _record(request, "chat", model, directive)
    if key := directive.get("key"):
        params = {k: v for k, v in body.items() if k != "messages"}
        stats = request.app[STATS_KEY]
        stats.params_by_key[str(key)] = params
        traceparent = request.headers.get("traceparent")
        stats.traceparents_by_key.setdefault(str(key), []).append(traceparent)
        names = sorted({name.lower() for name in request.headers})
        stats.header_names_by_key.setdefault(str(key), []).append(names)
    if not _applies(directive, model):
        directive = {}
    elif (failure := await _scripted_failure(request, directive)) is not None:
        request.app[STATS_KEY].by_status[failure.status] += 1
        return failure
    request.app[STATS_KEY].by_status[200] += 1
    if "flood_bytes" in directive:
        return await _flood(request, body, directive)
    reply = _build_reply(body, directive)
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if directive.get("no_usage"):
            include_usage = False
        return await _stream(request, reply, directive, include_usage)
    if directive.get("malformed"):
        return web.Response(text='{"id": "chatcmpl-broken", "choi', content_type="application/json")
    if "raw" in directive:
        return web.json_response(directive["raw"])
    payload = _completion_body(reply)
    if directive.get("no_usage"):
        del payload["usage"]
    return web.json_response(payload)


def _embedding(text: str, dim: int) -> list[float]:
    """A unit vector that depends only on the text: blake2b in counter mode -> [-1, 1)."""
    raw = b"".join(
        hashlib.blake2b(f"{i}:{text}".encode(), digest_size=64).digest()
        for i in range(math.ceil(dim * 4 / 64))
    )
    ints = struct.unpack(f"<{dim}I", raw[: dim * 4])
    vec = [x / 2**31 - 1.0 for x in ints]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def _encode(vec: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
    return vec


async def embeddings(request: web.Request) -> web.Response:
    body = await _read_json(request)
    if body is None:
        return _error(400, "body is not a JSON object")
    inputs = body.get("input", [])
    texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
    try:
        directive = _parse_directive(request.headers.get("x-fake"), " ".join(texts))
    except json.JSONDecodeError as exc:
        return _error(400, f"bad fake directive: {exc}")
    model = str(body.get("model", ""))
    _record(request, "embeddings", model, directive)
    if _applies(directive, model) and (failure := await _scripted_failure(request, directive)):
        request.app[STATS_KEY].by_status[failure.status] += 1
        return failure
    request.app[STATS_KEY].by_status[200] += 1
    dim = int(body.get("dimensions") or DEFAULT_EMBED_DIM)
    fmt = str(body.get("encoding_format") or "float")
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(_embedding(t, dim), fmt)}
        for i, t in enumerate(texts)
    ]
    tokens = max(sum(_word_count(t) for t in texts), 1)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return web.json_response({"object": "list", "data": data, "model": model, "usage": usage})


_WORD_RE = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD_RE.findall(text.lower()))


def overlap_score(query: str, document: str) -> float:
    """The fake reranker's relevance: the share of the query's words the document holds."""
    wanted = _words(_strip_directive(query))
    return len(wanted & _words(document)) / len(wanted) if wanted else 0.0


async def rerank(request: web.Request) -> web.Response:
    body = await _read_json(request)
    if body is None:
        return _error(400, "body is not a JSON object")
    query, documents = body.get("query"), body.get("documents")
    if not isinstance(query, str) or not isinstance(documents, list):
        return _error(400, "rerank needs a string 'query' and a list 'documents'")
    try:
        directive = _parse_directive(request.headers.get("x-fake"), query)
    except json.JSONDecodeError as exc:
        return _error(400, f"bad fake directive: {exc}")
    model = str(body.get("model", ""))
    _record(request, "rerank", model, directive)
    if _applies(directive, model) and (failure := await _scripted_failure(request, directive)):
        request.app[STATS_KEY].by_status[failure.status] += 1
        return failure
    request.app[STATS_KEY].by_status[200] += 1
    if directive.get("malformed"):
        return web.Response(text='{"results": [{"index"', content_type="application/json")
    if "raw" in directive:
        return web.json_response(directive["raw"])
    texts = [d if isinstance(d, str) else str(d.get("text", "")) for d in documents]
    scored = sorted(
        ((i, overlap_score(query, t)) for i, t in enumerate(texts)), key=lambda x: (-x[1], x[0])
    )
    if isinstance(top_n := body.get("top_n"), int):
        scored = scored[:top_n]
    billed = directive.get("billed_units", {"search_units": 1})
    return web.json_response(
        {
            "id": f"rerank-fake-{time.monotonic_ns()}",
            "results": [{"index": i, "relevance_score": score} for i, score in scored],
            "meta": {"billed_units": billed},
        }
    )


async def models(request: web.Request) -> web.Response:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in MODELS]
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def admin_stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS_KEY].as_json())


def create_app() -> web.Application:
    app = web.Application()
    app[STATS_KEY] = Stats()
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/rerank", rerank)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_route("GET", "/admin/stats", admin_stats)
    app.router.add_route("POST", "/admin/stats", admin_stats)
    return app
