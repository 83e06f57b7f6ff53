"""`gpuaas bench validate`: time `gpuaas validate` on a synthetic fleet of N nodes.

The fleet is written once with `gpuaas fleet synth`'s writer (N Node files
plus N SlotMap files) and reused on later runs; the figure printed is the
wall time of loading, parsing, typing and cross-checking the whole tree,
which is exactly what `gpuaas validate` does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from desired.reading import safefiles


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="time validation of a synthetic fleet (files: 2 per node)")
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--dir", type=Path, help="fleet directory to (re)use; default: a cache dir under /tmp")
    p.add_argument("--workers", type=int, help="parser processes (default: CPU count)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _ensure_fleet(root: Path, nodes: int) -> None:
    from reconciler.commands import fleet
    from reconciler.placement import synthesis

    marker = root / ".complete"
    if marker.exists():
        return
    for f in synthesis.fleet_documents(nodes, seed=0):
        fleet._dump(root / f.path, f.document)
    marker.write_text(str(nodes))


def run(args: argparse.Namespace) -> int:
    from desired.reading import loading
    from policies import validation

    root = args.dir or Path(tempfile.gettempdir()) / f"gpuaas-bench-fleet-{args.nodes}"
    _ensure_fleet(root, args.nodes)
    timings = []
    files = errors = 0
    for _ in range(args.runs):
        start = time.perf_counter()
        result = validation.validate(loading.parse_files(safefiles.iter_directory(root), workers=args.workers))
        timings.append(time.perf_counter() - start)
        files, errors = result.state.file_count, len(result.errors)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    doc = {
        "nodes": args.nodes,
        "files": files,
        "errors": errors,
        "workers": args.workers or os.cpu_count(),
        "seconds_best": round(min(timings), 2),
        "seconds_median": round(sorted(timings)[len(timings) // 2], 2),
        "peak_rss_mib": round(rss_mib),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(doc))
    else:
        print(
            f"validate {doc['nodes']} nodes ({doc['files']} files, {doc['errors']} errors): "
            f"best {doc['seconds_best']} s, median {doc['seconds_median']} s over {args.runs} runs, "
            f"{doc['workers']} workers, peak RSS {doc['peak_rss_mib']} MiB (load avg {doc['load_average_1m']})"
        )
    return 1 if errors else 0
