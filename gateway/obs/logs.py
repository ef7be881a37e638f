"""Structured logs: one JSON object per line, with the request id when there is one."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# LogRecord's own attributes; anything else on a record came from `extra=` and is logged.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


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
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


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


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # litellm and aiohttp's access log are chatty at INFO; our own lines say what matters.
    for noisy in ("LiteLLM", "litellm", "httpx", "aiohttp.access", "opensearch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpFilter) for f in server.filters):
        server.addFilter(MalformedHttpFilter())
