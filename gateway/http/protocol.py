"""The HTTP/1.1 connection: aiohttp's, with a deadline on request headers and JSON protocol errors.

aiohttp gives a connection its keep-alive timeout to send a request and no deadline on the
request's headers once bytes arrive, so a client sending half a header (or one byte a second)
would hold a connection, its task and a file descriptor for over a minute; a few thousand of
those from one client starve everyone. Here each request's headers must be complete within
`server.header_read_timeout_s` of its first byte (the connection's first request: of connecting),
else the connection is closed (with a 408 if any of them came). Bodies keep
`server.body_read_timeout_s` (read in `gateway.http.middleware.limits`), answers and streams no
limit from here, and an idle keep-alive connection (no byte of a next request)
`server.keepalive_timeout_s` (75 s, `web.run_app`'s; a `web.Server` left to its own default
keeps one 3630 s, so idle connections, one fd each, would pile up for an hour). Both settings
are read for each new connection, so a reload applies to the connections after it.

The parser's own refusals (a malformed request line or header, a line over 8190 bytes, a bad
chunk) never reach the middleware; they get the `{"error": {"type", "message"}}` body every
other error has, not aiohttp's plain text.

aiohttp has no setting for the handler class (`web.Server` makes a `RequestHandler`), so
`run_app` is `aiohttp.web.run_app` for one socket with a `web.Server` that makes ours.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest
from aiohttp.web_runner import GracefulExit

from gateway.errors import RequestTimeout, clip
from gateway.http.failures import error_response

log = logging.getLogger(__name__)

_QUOTED = re.compile(r":\s*(?:b['\"]|bytearray\()")
_KINDS = {408: "request_timeout", 413: "payload_too_large"}


class GatewayRequestHandler(RequestHandler):
    __slots__ = ("_header_bytes", "_header_timeout_s", "_header_timer", "_last_payload")

    def __init__(self, manager: web.Server, *, header_read_timeout_s: float, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_read_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = False  # a byte of the request awaited has come
        # The body of the last request whose headers came: bytes before its end are its body.
        self._last_payload: StreamReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        between_requests = self._last_payload is None or self._last_payload.is_eof()
        if data and self._header_timer is None and between_requests:
            self._arm_header_deadline()  # the first byte of a keep-alive's next request
        if data and self._header_timer is not None:
            self._header_bytes = True
        body = None if between_requests else self._last_payload
        count = self._request_count
        super().data_received(data)
        if self._request_count > count and self._messages:  # headers complete
            message, self._last_payload = self._messages[-1]
            self._disarm_header_deadline()
            if body is not None and isinstance(message, _ErrInfo):
                self._refuse_body(body, message)
        # Known gap: a partial request pipelined in the same read as a whole one is not timed
        # (the parser does not say it holds one); the keep-alive timeout still bounds it.

    def _refuse_body(self, body: StreamReader, refusal: _ErrInfo) -> None:
        """The parser refused the body being read (a bad chunk size, a corrupt chunk): aiohttp
        queues that as a next request and leaves the body waiting for bytes that never come,
        so the request would hang until `body_read_timeout_s` (a 408 for a 400), then hold the
        connection another 10 s lingering on the body. The body's reader gets the error now
        (`gateway.http.body.read_body` answers 400) and the connection closes
        after the answer: where the next request would start is unknown."""
        self._messages.pop()
        self._request_count -= 1
        self._last_payload = body
        body.set_exception(refusal.exc)
        body.feed_eof()  # its reads raise the error; nothing lingers on it
        self.close()

    def _arm_header_deadline(self) -> None:
        self._header_bytes = False
        self._header_timer = self._loop.call_later(self._header_timeout_s, self._headers_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is None or self._force_close or self._close:
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Busy answering an earlier request (pipelined bytes of the next one armed this):
            # look again a deadline later, so a long answer or stream is never cut.
            started = self._header_bytes
            self._arm_header_deadline()
            self._header_bytes = started
            return
        if self._header_bytes:  # a request was under way: say why it is refused
            message = f"request headers not received within {self._header_timeout_s:g} s"
            transport.write(_raw_error(408, RequestTimeout.type, message))
        log.info(
            "connection closed: request headers too slow",
            extra={"peer": _peer(transport), "header_read_timeout_s": self._header_timeout_s},
        )
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The parser's refusals (and an error past the middleware) as the gateway's JSON error.
        aiohttp's own handling still logs (`gateway.obs.logs.MalformedHttpFilter` makes a refusal
        one INFO line) and raises if an answer was partly sent; its plain text is dropped."""
        super().handle_error(request, status, exc, message)
        if status >= 500:
            text, kind = "internal error", "internal_error"
        else:
            detail = (message or (str(exc) if exc else "")).strip().splitlines() or [""]
            # The parser's first line, without the client's bytes it quotes after a colon.
            reason = _QUOTED.split(detail[0])[0].rstrip(" :.") or HTTPStatus(status).phrase
            if isinstance(exc, LineTooLong):
                reason = f"a request line or header is over {self.max_field_size} bytes"
            text = f"malformed HTTP request: {clip(reason, 160)}"
            kind = _KINDS.get(status, "bad_request")
        response = error_response(status, kind, text)
        response.force_close()
        return response


def _peer(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else None


def _raw_error(status: int, kind: str, message: str) -> bytes:
    """A whole error response, written straight to the transport (there is no request)."""
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass(frozen=True, slots=True)
class ConnectionTimeouts:
    """The current settings a new connection takes (a reload's, from then on)."""

    header_read_s: Callable[[], float]
    keepalive_s: Callable[[], float]


class _Server(web.Server):
    def __init__(self, built: web.Server, timeouts: ConnectionTimeouts, **kwargs: Any) -> None:
        # The app's handler and request factory, with the runner's own arguments.
        super().__init__(built.request_handler, request_factory=built.request_factory, **kwargs)
        self._timeouts = timeouts

    def __call__(self) -> RequestHandler:
        return GatewayRequestHandler(
            self,
            loop=self._loop,
            header_read_timeout_s=self._timeouts.header_read_s(),
            **{**self._kwargs, "keepalive_timeout": self._timeouts.keepalive_s()},
        )


class _Runner(web.AppRunner):
    __slots__ = ("_timeouts",)

    def __init__(self, app: web.Application, timeouts: ConnectionTimeouts, **kwargs: Any):
        super().__init__(app, **kwargs)
        self._timeouts = timeouts

    async def _make_server(self) -> web.Server:
        built = await super()._make_server()  # starts the app
        return _Server(built, self._timeouts, **self._kwargs)


def run_app(
    app: web.Application,
    *,
    host: str | None = None,
    port: int | None = None,
    sock: socket.socket | None = None,
    timeouts: ConnectionTimeouts,
    print: Callable[[str], None],
    **kwargs: Any,
) -> None:
    """`aiohttp.web.run_app` (one TCP site or socket; SIGINT/SIGTERM end it gracefully) with
    `GatewayRequestHandler`; `timeouts` give the current settings (read for each new
    connection); `kwargs` are its runner's (shutdown_timeout, access_log, ...)."""

    async def serve() -> None:
        runner = _Runner(app, timeouts, handle_signals=True, **kwargs)
        await runner.setup()
        try:
            site = web.SockSite(runner, sock) if sock else web.TCPSite(runner, host, port)
            await site.start()
            print(f"======== Running on {site.name} ========")
            await asyncio.Event().wait()  # until SIGINT/SIGTERM
        finally:
            await runner.cleanup()

    loop = asyncio.new_event_loop()
    main = loop.create_task(serve())
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    except (GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not main.done():
                main.cancel()
                loop.run_until_complete(asyncio.gather(main, return_exceptions=True))
        finally:
            rest = asyncio.all_tasks(loop)
            for task in rest:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
