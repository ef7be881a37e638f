"""What reading a flooding upstream costs: a reply of N MiB whatever `max_tokens` says.

    python bench/flood_upstream.py [--mib 300]

Starts the fake upstream (tests/fake_upstream, its `flood_bytes` directive) and calls it through
`LiteLLMTiers` on both wires, non-streamed and streamed, with the tier's default settings after
`warm_up`. Prints, per wire and mode, the bound that cut the reply, the text kept, what Python
allocated while the call ran (tracemalloc's peak) and the process's RSS before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tracemalloc

from backends.llm.base import LLMCall, Message, TierConfig
from backends.llm.tiers import LiteLLMTiers


def rss_mib() -> int:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields["VmRSS"].split()[0]) // 1024


async def one(llm: LiteLLMTiers, call: LLMCall, stream: bool) -> tuple[str, str | None]:
    if not stream:
        done = await llm.complete(call)
        return done.text, done.cut
    deltas = [delta async for delta in llm.stream(call)]
    return "".join(d.text for d in deltas), deltas[-1].cut


async def measure(url: str, mib: int) -> None:
    directive = json.dumps({"flood_bytes": mib << 20})
    call = LLMCall("small", (Message("user", f"say a little [[fake:{directive}]]"),))
    for lean in (True, False):
        tier = TierConfig(model="openai/fake-small", api_base=url, retries=0, timeout_s=60)
        llm = LiteLLMTiers(tier, None, lean_http=lean)
        await llm.warm_up()
        for stream in (False, True):
            before = rss_mib()
            tracemalloc.start()
            text, cut = await one(llm, call, stream)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(
                f"{'lean' if lean else 'litellm'} {'stream' if stream else 'body'}: "
                f"cut={cut} text={len(text)} B peak={peak / 2**20:.1f} MiB "
                f"rss {before} -> {rss_mib()} MiB"
            )
        await llm.aclose()


def main(mib: int) -> None:
    command = [sys.executable, "-m", "tests.fake_upstream", "--host", "127.0.0.1", "--port", "0"]
    upstream = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert upstream.stdout is not None
    url = upstream.stdout.readline().decode().split()[-1] + "/v1"
    try:
        asyncio.run(measure(url, mib))
    finally:
        upstream.kill()
        upstream.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=300, help="the reply's size")
    main(parser.parse_args().mib)
