"""An OTLP/HTTP receiver that discards what it gets: where a traced querygate exports its spans in
bench/proxy_compare.py --tracing, so the benchmark weighs the gateway's tracing, not a backend.

    python bench/otlp_sink.py --port N

POST /v1/traces reads the body, counts it and answers 200 with an empty (valid) protobuf
ExportTraceServiceResponse. GET /stats: `{"exports": N, "bytes": B}`, proof the spans came;
GET /health answers for the launcher.
"""

from __future__ import annotations

import argparse
from collections import Counter

from aiohttp import web

COUNTS = web.AppKey("counts", Counter[str])


async def traces(request: web.Request) -> web.Response:
    body = await request.read()
    counts = request.app[COUNTS]
    counts["exports"] += 1
    counts["bytes"] += len(body)
    return web.Response(body=b"", content_type="application/x-protobuf")


async def stats(request: web.Request) -> web.Response:
    return web.json_response(dict(request.app[COUNTS]))


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app[COUNTS] = Counter()
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/stats", stats)
    app.router.add_get("/health", health)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
