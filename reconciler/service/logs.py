"""Log lines of `gpuaas serve`: the shared format of schemas/logs.py (`--log-format json`: JSON lines).

Kept as the service's name for it; the formatter itself lives in `schemas`
so the host agent, which imports no `reconciler`, logs the same way.
"""

from __future__ import annotations

from schemas.logs import ENV, FORMATS, JsonFormatter, choose, configure, configured, release

__all__ = ["ENV", "FORMATS", "JsonFormatter", "choose", "configure", "configured", "release"]
