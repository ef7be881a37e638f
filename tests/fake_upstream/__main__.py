"""``python -m tests.fake_upstream --host 127.0.0.1 --port N``: serve until terminated.

``--port 0`` picks a free port; the ready line on stdout names the one bound, so a launcher
never races another process for a port it chose in advance.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web

from tests.fake_upstream.server import create_app


async def serve(host: str, port: int) -> None:
    runner = web.AppRunner(create_app(), access_log=None)
    await runner.setup()
    # scripted delays may hold handlers for seconds; don't let them stall a test run's teardown
    site = web.TCPSite(runner, host, port, shutdown_timeout=0.5)
    await site.start()
    bound_port = runner.addresses[0][1]
    print(f"fake-upstream ready on http://{host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fake_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
