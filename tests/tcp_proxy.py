"""A TCP forwarder run as its own process: kill it and the service behind it is "down".

python -m tests.tcp_proxy --port LISTEN --target HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def serve(port: int, host: str, target_port: int) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection(host, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"tcp-proxy ready on {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True)
    args = parser.parse_args()
    host, _, target_port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, host, int(target_port)))


if __name__ == "__main__":
    main()
