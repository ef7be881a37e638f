"""A TCP forwarder run as its own process: kill it and the service behind it is "down".

python -m tests.tcp_proxy --port LISTEN --target HOST:PORT [--mode MODE] [--delay-ms N]

Modes, for chaos tests: `pass` forwards; `slow` forwards each piece of data after --delay-ms;
`garbage` answers every connection with bytes that are not HTTP and closes; `bad_json` answers
every request with HTTP 200 and a body that is not JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

GARBAGE = b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1 not http at all \xff\xfe\r\n\r\n"
BAD_JSON = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
    b'Connection: close\r\n\r\n{"broken": [1, 2'
)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    try:
        while data := await reader.read(65536):
            if delay_s:
                await asyncio.sleep(delay_s)
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _answer(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, raw: bytes
) -> None:
    with contextlib.suppress(ConnectionError):
        await client_r.read(65536)  # the request, unread
        client_w.write(raw)
        await client_w.drain()
    client_w.close()


async def serve(port: int, host: str, target_port: int, mode: str, delay_s: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if mode in ("garbage", "bad_json"):
            await _answer(client_r, client_w, GARBAGE if mode == "garbage" else BAD_JSON)
            return
        try:
            upstream_r, upstream_w = await asyncio.open_connection(host, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            _pipe(client_r, upstream_w, delay_s), _pipe(upstream_r, client_w, delay_s)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"tcp-proxy ready on {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--mode", choices=("pass", "slow", "garbage", "bad_json"), default="pass")
    parser.add_argument("--delay-ms", type=int, default=0)
    args = parser.parse_args()
    host, _, target_port = args.target.rpartition(":")
    delay_s = args.delay_ms / 1000 if args.mode == "slow" else 0.0
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, host, int(target_port), args.mode, delay_s))


if __name__ == "__main__":
    main()
