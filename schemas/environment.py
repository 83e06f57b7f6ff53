"""The environment variables both agents read, named once.

The central reconciler reads them in one place (reconciler/settings.py);
the host agent reads the database URL too, for its direct-database lab
mode (host_reconciler/command.py).
"""

from __future__ import annotations

DATABASE_URL = "GPUAAS_DATABASE_URL"  # an external PostgreSQL; without it the state dir's embedded server
STATE_DIR = "GPUAAS_STATE_DIR"  # the state dir (`.gpuaas` by default): the embedded server, the caches
