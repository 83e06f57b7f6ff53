"""The planner and the desired-state core load no cache or process machinery.

Every command and the service import the planner; the value types of the
desired state are imported by every layer. Neither may drag in the parse
pool (multiprocessing), the cache store (sqlite3) or pickle: those belong to
the reader and to `reconciler.caches`, and cost every import their time.
Checked in a fresh interpreter, where nothing else has loaded them first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("sqlite3", "multiprocessing", "pickle", "_pickle", "concurrent.futures")


def _loaded_by(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ.copy(), timeout=120
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(
    "module", ["reconciler.placement.planner", "desired.state", "desired.models", "policies.validation"]
)
def test_importing_it_loads_no_store_pool_or_pickle(module: str) -> None:
    loaded = _loaded_by(module)
    assert module in loaded
    assert sorted(loaded & set(HEAVY)) == []
