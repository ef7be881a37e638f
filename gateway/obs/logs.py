"""Logs: one JSON object per line, with the request id when there is one (and its trace id
when traced); on a terminal (or when asked) one short line of text per request instead, the
health probes' quiet unless they fail. `configure_logging` chooses: `json`, `text`, or `auto`
(text when stderr is a terminal)."""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from aiohttp.http_exceptions import HttpProcessingError
from opentelemetry import trace

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# LogRecord's own attributes; anything else on a record came from `extra=` and is logged.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

LogFormat = Literal["auto", "json", "text"]
# Asked every few seconds by the orchestrator and the scraper: on a terminal, noise when they
# succeed.
PROBES = frozenset({"GET /healthz", "GET /readyz", "GET /metrics"})
# A request's line on a terminal: these fields, when set, after endpoint, status and time.
_REQUEST_TAIL = ("route", "cache", "tenant")
# Any other line on a terminal: its fields while it fits this width (the JSON has them all).
TEXT_WIDTH = 120
# Control characters in a text line: a client's or an upstream's text (an error message, a
# field) must not move the cursor or retitle the operator's terminal, so they are shown escaped.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,  # which worker, with `serve --workers N`
        }
        request_id = request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        # The request's trace (gateway.obs.tracing), to go from this line to its spans; a
        # valid context only while tracing is on.
        traced = trace.get_current_span().get_span_context()
        if traced.is_valid:
            entry["trace_id"] = trace.format_trace_id(traced.trace_id)
            entry["span_id"] = trace.format_span_id(traced.span_id)
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _is_request(record: logging.LogRecord) -> bool:
    """The one line per request `gateway.obs.accounting.account` writes."""
    return "endpoint" in record.__dict__ and "status" in record.__dict__


class TextFormatter(logging.Formatter):
    """One short line: a request as `METHOD PATH STATUS MS route cache tenant` (and its error),
    anything else as `HH:MM:SS [LEVEL] message key=value ...`. `clear_line` (a terminal) first
    clears the line, so a line written over an ingest's progress bar replaces it (the bar is
    redrawn below)."""

    def __init__(self, clear_line: bool = False) -> None:
        super().__init__()
        self._prefix = "\r\x1b[K" if clear_line else ""

    def format(self, record: logging.LogRecord) -> str:
        line = _request_line(record) if _is_request(record) else self._other_line(record)
        line = _CONTROL.sub(lambda m: repr(m.group())[1:-1], line)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self._prefix + line

    def _other_line(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        level = "" if record.levelno == logging.INFO else f" {record.levelname}"
        line = f"{when}{level} {record.getMessage()}"
        for key, value in record.__dict__.items():
            if key in _STANDARD:
                continue
            field = f" {key}={value}"
            if len(line) + len(field) > TEXT_WIDTH:
                return line + " …"
            line += field
        return line


def _request_line(record: logging.LogRecord) -> str:
    fields = record.__dict__
    parts = [str(fields["endpoint"]), str(fields["status"]), f"{fields['duration_ms']:.0f}ms"]
    parts += [str(fields[key]) for key in _REQUEST_TAIL if fields.get(key)]
    if error := fields.get("error"):
        parts.append(f"({error})")
    return " ".join(parts)


class QuietProbes(logging.Filter):
    """Drops the line of a health probe or scrape that succeeded; one that failed is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_request(record) or record.__dict__["endpoint"] not in PROBES:
            return True
        return int(record.__dict__["status"]) >= 400 or record.levelno >= logging.WARNING


class MalformedHttpFilter(logging.Filter):
    """aiohttp logs every request its parser refuses (a bad request line, a header over 8190
    bytes, too many headers, a broken chunk size) at ERROR with a traceback, and answers it 400
    itself. That is a client's mistake, sent by anyone unauthenticated: at ERROR it pages an
    operator and costs ~1.5 KB of log per 50-byte request. It becomes one INFO line naming the
    refusal; aiohttp's other errors stay as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        if isinstance(record.args, tuple) and record.args:
            record.remote = record.args[0]  # "Error handling request from %s"
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "malformed HTTP request refused", None
        record.exc_info, record.exc_text = None, None
        record.status = exc.code
        record.error = exc.message[:200]  # it may quote the client's bytes: bounded
        # The logger's level was checked at ERROR: at INFO the line may no longer be wanted.
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "text"]:
    """`auto`: text on a terminal, JSON otherwise (a file, a pipe, a log collector)."""
    if fmt == "auto":
        return "text" if stream.isatty() else "json"
    return fmt


def configure_logging(
    level: str = "INFO", fmt: LogFormat = "auto", stream: TextIO | None = None
) -> Literal["json", "text"]:
    """Every log line to `stream` (stderr) in `fmt`; returns the format chosen."""
    stream = sys.stderr if stream is None else stream
    chosen = resolve_format(fmt, stream)
    handler = logging.StreamHandler(stream)
    if chosen == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(clear_line=stream.isatty()))
        handler.addFilter(QuietProbes())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # litellm and aiohttp's access log are chatty at INFO; our own lines say what matters.
    for noisy in ("LiteLLM", "litellm", "httpx", "aiohttp.access", "opensearch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpFilter) for f in server.filters):
        server.addFilter(MalformedHttpFilter())
    return chosen
