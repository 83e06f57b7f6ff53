"""Log lines of the long-running commands (`run`, `serve`, `host run`): text, or one JSON object per line.

Both agents log through the `gpuaas` logger tree, so the format is one
contract: it lives here, below both (the host agent imports no `reconciler`).

A JSON line has `time` (UTC, ISO 8601, milliseconds), `level`, `event`
(`extra={"event": ...}`, else the logger's name) and `message`, plus every
other field the call passed in `extra` (revision, allocation, node, code,
method, path, status, ms, ...) and the handler's defaults (the host agent
stamps `node` on each line). `--log-format json` selects it;
GPUAAS_LOG_FORMAT=json does where the flag is not given.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

from schemas import codes as schemas_codes
from schemas.errors import UsageError

ENV = "GPUAAS_LOG_FORMAT"
FORMATS = ("text", "json")
ROOT = "gpuaas"  # every logger of the product is below this one

# Attributes every LogRecord has: whatever else a record carries came from `extra`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def utc_ms(created: float) -> str:
    """`2026-01-02T03:04:05.678Z`: the time stamp of a text line."""
    return dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or record.name,
            "message": record.getMessage(),
        }
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in doc})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """`pattern` in %-style, with `%(asctime)s` as `utc_ms` (what operators read and grep)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_ms(record.created)


class _StdStream(logging.StreamHandler[TextIO]):
    """Writes to sys.stdout or sys.stderr as they are at each line (pytest swaps them per test)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = getattr(sys, self._name)
        super().emit(record)


class _Defaults(logging.Filter):
    def __init__(self, fields: Mapping[str, Any]) -> None:
        super().__init__()
        self._fields = dict(fields)

    def filter(self, record: logging.LogRecord) -> bool:
        for k, v in self._fields.items():
            if not hasattr(record, k):
                setattr(record, k, v)
        return True


def choose(flag: str | None) -> str:
    """The flag, else $GPUAAS_LOG_FORMAT, else text; an unknown value in the variable is an error."""
    value = flag or os.environ.get(ENV) or "text"
    if value not in FORMATS:
        raise UsageError(
            f"{ENV}={value!r}: the log format is one of {', '.join(FORMATS)}", code=schemas_codes.CLI_LOG_FORMAT_UNKNOWN
        )
    return value


def configure(
    fmt: str,
    *,
    level: int = logging.INFO,
    stream: str = "stderr",
    text: str = "%(asctime)s %(levelname)s %(message)s",
    defaults: Mapping[str, Any] | None = None,
) -> logging.Handler:
    """Send the `gpuaas` loggers to sys.`stream` in `fmt`; returns the handler (`release` takes it off)."""
    handler = _StdStream(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(text))
    if defaults:
        handler.addFilter(_Defaults(defaults))
    logger = logging.getLogger(ROOT)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler


def release(handler: logging.Handler) -> None:
    logging.getLogger(ROOT).removeHandler(handler)
    handler.close()


@contextmanager
def configured(fmt: str, **kwargs: Any) -> Iterator[logging.Handler]:
    """`configure` for the life of a command (in-process callers, tests, get no handler left behind)."""
    handler = configure(fmt, **kwargs)
    try:
        yield handler
    finally:
        release(handler)
