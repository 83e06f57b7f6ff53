"""Log lines of the long-running commands: plain text, or one JSON object per line (`--log-format json`).

A JSON line has `time` (UTC, ISO 8601), `level`, `event` and `message`, plus
whichever of the structured fields the call passed in `extra`
(method, path, status, ms, revision, allocation, node, code).
GPUAAS_LOG_FORMAT=json selects JSON where the flag is not given.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from typing import TextIO

ENV = "GPUAAS_LOG_FORMAT"
FORMATS = ("text", "json")
FIELDS = ("method", "path", "status", "ms", "revision", "allocation", "node", "code")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or record.name,
            "message": record.getMessage(),
        }
        doc.update({k: getattr(record, k) for k in FIELDS if hasattr(record, k)})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def choose(flag: str | None) -> str:
    value = flag or os.environ.get(ENV) or "text"
    return value if value in FORMATS else "text"


def configure(fmt: str, *, level: int = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Send the `gpuaas` loggers to `stream` (stderr) in `fmt`; returns the handler (tests remove it)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("gpuaas")
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
