"""The central reconciler's settings: its environment, read in this module only.

  GPUAAS_DATABASE_URL   an external PostgreSQL (else the state dir's embedded server)
  GPUAAS_STATE_DIR      the state dir, `.gpuaas` by default (the embedded server, caches)
  GPUAAS_EMBEDDED_ROOT  where root keeps embedded servers of state dirs `postgres` cannot reach
  GPUAAS_PG_BIN         the PostgreSQL server binaries (else the newest Debian install)

`current()` reads them when asked, so a process that changes its own
environment (a test) sees the change; nothing else on the central side
reads `os.environ` for these. Flags win over the environment: the commands
pass `--db-url` and `--state-dir` to `reconciler.store.connections`, which
consults these settings only for what was not given.

Defaults of the desired state (claim candidates, provision attempts,
timeouts) are `desired.defaults`: the Fleet model and the reconciler's
fallbacks read the same constants.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from schemas import environment

ENV_URL = environment.DATABASE_URL
ENV_STATE_DIR = environment.STATE_DIR
ENV_EMBEDDED_ROOT = "GPUAAS_EMBEDDED_ROOT"
ENV_PG_BIN = "GPUAAS_PG_BIN"

DEFAULT_STATE_DIR = Path(".gpuaas")


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str | None  # None: use the embedded server
    state_dir: Path
    embedded_root: Path | None  # None: the built-in root (reconciler.store.embedded.DEFAULT_ROOT)
    pg_bin: Path | None  # None: look for an installed server
    cache_dir: Path  # the on-disk caches (reconciler.caches.cachestore)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Settings from an environment; an empty variable counts as unset."""
        root = environ.get(ENV_EMBEDDED_ROOT)
        pg_bin = environ.get(ENV_PG_BIN)
        return cls(
            cache_dir=_cache_dir(environ),
            database_url=environ.get(ENV_URL) or None,
            state_dir=Path(environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR),
            embedded_root=Path(os.path.abspath(root)) if root else None,
            pg_bin=Path(pg_bin) if pg_bin else None,
        )


def _cache_dir(environ: Mapping[str, str]) -> Path:
    """`$GPUAAS_STATE_DIR/cache`, else the user's cache dir: `${XDG_CACHE_HOME:-~/.cache}/gpuaas/cache`.

    Never the database's default state dir (`.gpuaas`, relative to where the
    command runs): CI runs from the checkout root, so a cache there would be
    one the pull request being planned can commit, key and all.
    """
    state = environ.get(ENV_STATE_DIR)
    if state:
        return Path(state) / "cache"
    xdg = environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "gpuaas" / "cache"


def current() -> Settings:
    """The settings of this process's environment now."""
    return Settings.from_env(os.environ)
