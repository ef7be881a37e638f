"""How soon a cold first run answers the README's example question right.

    nice -n 10 .venv/bin/python bench/first_answer.py               # this checkout
    nice -n 10 .venv/bin/python bench/first_answer.py --until-complete

Starts `querygate serve --sample-corpus` on a fresh data directory (what `scripts/quickstart.sh`
runs on first use), then asks `POST /v1/query` the README's question every `--every` seconds
from the moment the port answers. "Right" is the README's own example answer: the first
citation is the "Eiffel Tower" page. Reported (seconds from the process's start): the port
answering, the first right answer (with the `partial_index` it carried and how many wrong
answers came before), and with `--until-complete` the ingest's end. The gateway is the
checkout in the current directory (`python -m gateway`), so the same command run from another
checkout measures that one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

QUESTION = "Who designed the Eiffel Tower?"
RIGHT_PAGE = "Eiffel Tower"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = requests.get(url, timeout=5).json()
    except requests.ConnectionError:
        return None
    return body


def measure(data_dir: Path, every_s: float, until_complete: bool, limit_s: float) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "QUERYGATE_DATA_DIR": str(data_dir)}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--sample-corpus"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    result: dict[str, Any] = {"question": QUESTION}
    wrong: list[str] = []
    try:
        while _get(f"{url}/readyz") is None:
            if proc.poll() is not None or time.monotonic() - started > limit_s:
                raise SystemExit(f"the gateway did not open its port (exit {proc.poll()})")
            time.sleep(0.1)
        result["port_answers_s"] = round(time.monotonic() - started, 2)
        key = (data_dir / "demo_api_key").read_text().strip()
        while time.monotonic() - started < limit_s:
            asked = time.monotonic()
            answer = requests.post(
                f"{url}/v1/query",
                headers={"Authorization": f"Bearer {key}"},
                json={"query": QUESTION},
                timeout=60,
            )
            answer.raise_for_status()
            body = answer.json()
            cited = [c["doc_id"] for c in body["citations"]]
            if cited[:1] == [RIGHT_PAGE]:
                result["right_answer_s"] = round(time.monotonic() - started, 2)
                result["partial_index"] = body.get("partial_index")
                result["wrong_answers_before"] = len(wrong)
                result["first_wrong_citations"] = wrong[:1]
                break
            wrong.append(", ".join(cited[:3]))
            time.sleep(max(0.0, every_s - (time.monotonic() - asked)))
        while until_complete and time.monotonic() - started < limit_s:
            ready = _get(f"{url}/readyz") or {}
            ingest = ready.get("ingest", {})
            if ingest.get("state") in ("done", "failed"):
                result["ingest_done_s"] = round(time.monotonic() - started, 2)
                result["ingest"] = ingest
                break
            time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between questions")
    parser.add_argument("--until-complete", action="store_true")
    parser.add_argument("--limit", type=float, default=1800.0, help="give up after (s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="first-answer-") as tmp:
        result = measure(Path(tmp) / "data", args.every, args.until_complete, args.limit)
    result["cores"] = os.cpu_count()
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))
    return 0 if "right_answer_s" in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
