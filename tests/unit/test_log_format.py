"""The log's two forms: JSON lines as ever when stderr is not a terminal (or when asked); on a
terminal one short line per request, the health probes' only when they fail."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.obs.accounting import RequestRecord, account
from gateway.obs.logs import TEXT_WIDTH, configure_logging
from gateway.obs.metrics import Metrics


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def requests(metrics: Metrics) -> None:
    """What the outcome middleware logs for a query, two probes and a failing probe."""
    query = RequestRecord("POST /v1/query", tenant="acme")
    query.fields.update({"route": "lookup", "cache": "miss"})
    account(metrics, "r1", query, 200, "ok")
    account(metrics, "r2", RequestRecord("GET /healthz"), 200, "ok")
    account(metrics, "r3", RequestRecord("GET /readyz"), 200, "ok")
    account(metrics, "r4", RequestRecord("GET /readyz"), 503, "unavailable", "retrieval down")


def test_a_terminal_gets_one_short_line_per_request_and_failing_probes_only() -> None:
    terminal = Terminal()
    assert configure_logging("INFO", "auto", terminal) == "text"
    requests(Metrics())
    lines = [line.replace("\r\x1b[K", "") for line in terminal.getvalue().split("\n") if line]
    assert len(lines) == 2, lines
    query, probe = lines
    method, path, status, ms, *tail = query.split(" ")
    assert (method, path, status, tail) == ("POST", "/v1/query", "200", ["lookup", "miss", "acme"])
    assert ms.endswith("ms") and ms[:-2].isdigit()
    assert probe.startswith("GET /readyz 503 ") and "(retrieval down)" in probe


def test_not_a_terminal_gets_every_request_as_json() -> None:
    pipe = io.StringIO()
    assert configure_logging("INFO", "auto", pipe) == "json"
    requests(Metrics())
    entries = [json.loads(line) for line in pipe.getvalue().splitlines()]
    assert [e["endpoint"] for e in entries] == [
        "POST /v1/query",
        "GET /healthz",
        "GET /readyz",
        "GET /readyz",
    ]
    assert entries[0]["route"] == "lookup" and entries[0]["request_id"] == "r1"


def test_json_when_asked_on_a_terminal_and_text_when_asked_on_a_pipe() -> None:
    terminal = Terminal()
    assert configure_logging("INFO", "json", terminal) == "json"
    requests(Metrics())
    assert len([json.loads(line) for line in terminal.getvalue().splitlines()]) == 4
    pipe = io.StringIO()
    assert configure_logging("INFO", "text", pipe) == "text"
    requests(Metrics())
    assert pipe.getvalue().splitlines()[0].startswith("POST /v1/query 200 ")  # no escapes


def test_other_lines_on_a_terminal_stay_within_the_width() -> None:
    pipe = io.StringIO()
    configure_logging("INFO", "text", pipe)
    logging.getLogger("t").info("ingest started", extra={f"field{i}": "x" * 20 for i in range(9)})
    (line,) = pipe.getvalue().splitlines()
    assert "ingest started field0=" in line and line.endswith(" …")
    assert len(line) <= TEXT_WIDTH + 2


def test_control_characters_in_a_text_line_are_shown_escaped() -> None:
    pipe = io.StringIO()
    configure_logging("INFO", "text", pipe)
    retitle = "\x1b]0;owned\x07\x1b[2J"  # an OSC title, then clear the screen
    failed = RequestRecord("POST /v1/query", tenant="acme")
    account(Metrics(), "r1", failed, 503, "unavailable", f"upstream said {retitle}")
    logging.getLogger("t").warning("rerank failed", extra={"error": f"body {retitle}\nforged"})
    request, other = pipe.getvalue().splitlines()
    assert "\x1b" not in pipe.getvalue() and "\x07" not in pipe.getvalue()
    assert request.endswith(r"(upstream said \x1b]0;owned\x07\x1b[2J)")
    assert other.endswith(r"error=body \x1b]0;owned\x07\x1b[2J\nforged")  # one line, not two
