"""The floor of this stack: an aiohttp server that forwards a chat completion and nothing else.

    python bench/bare_forwarder.py --upstream http://127.0.0.1:PORT/v1 --port N

POST /v1/chat/completions goes to the upstream's /chat/completions as received, over one pooled
aiohttp ClientSession, and its answer comes back as is: read whole, or relayed chunk by chunk
when the upstream streams (text/event-stream). No parsing, auth, limits, logging or metrics:
what querygate spends above this on the same upstream is its own overhead
(bench/proxy_compare.py runs both side by side). GET /health answers for the launcher.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
FORWARDED = ("Content-Type", "Authorization")


async def forward(request: web.Request) -> web.StreamResponse:
    headers = {k: v for k in FORWARDED if (v := request.headers.get(k))}
    url = request.app[UPSTREAM] + "/chat/completions"
    async with request.app[SESSION].post(url, data=await request.read(), headers=headers) as up:
        kind = up.content_type
        if kind != "text/event-stream":
            return web.Response(body=await up.read(), status=up.status, content_type=kind)
        out = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
        await out.prepare(request)
        async for chunk in up.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def pooled_session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        app[SESSION] = session
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://HOST:PORT/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app[UPSTREAM] = args.upstream.rstrip("/")
    app.cleanup_ctx.append(pooled_session)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/health", health)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
