"""`gpuaas fleet synth|workload`: synthetic fleets and workloads for capacity planning.

    gpuaas fleet synth --nodes 1000 --out /tmp/fleet [--amd-share 0.1] [--seed 7]
    gpuaas fleet workload --fleet /tmp/fleet --load 0.9 --requests 50000 --out w.csv \
        [--lease-terms [1h,24h,7d] [--early-release 0.3]]

`synth` writes the examples/fleet layout (fleet.yaml, skus/, images/, nodes/,
slotmaps/) and the result passes `gpuaas validate`. `workload` writes a CSV
with the header `arrival_s,duration_s,sku,gpus` for `gpuaas simulate`; with
`--lease-terms` a fifth column, `lease_s`: the term each request buys (its
planned use rounded up to the shortest term that covers it), with an
`--early-release` share of requests that planned up to 10x longer than they
use. Arrivals and durations are the same with or without terms.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path
from typing import Any

from schemas import progress
from schemas.errors import UsageError

_OWNED = ("fleet.yaml", "skus", "images", "nodes", "slotmaps")


def register(sub: Any) -> None:
    p = sub.add_parser("fleet", help="synthetic fleets and workloads for capacity planning")
    fsub = p.add_subparsers(dest="fleet_command", metavar="FLEET")
    fsub.required = True

    s = fsub.add_parser("synth", help="write a synthetic fleet of H200-style 8-GPU hosts")
    s.add_argument("--nodes", type=int, required=True, help="number of hosts")
    s.add_argument("--out", type=Path, required=True, help="directory to write (must be empty unless --force)")
    s.add_argument("--amd-share", type=float, default=0.0, help="fraction of hosts that are MI300X RoCE")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--force", action="store_true", help="replace a fleet already in --out")
    progress.add_argument(s)
    s.set_defaults(func=run_synth)

    w = fsub.add_parser("workload", help="write a request stream CSV at a target offered load")
    w.add_argument("--fleet", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True, help="CSV file to write ('-' for stdout)")
    w.add_argument("--load", type=float, required=True, help="offered GPU load as a fraction of the fleet")
    w.add_argument("--requests", type=int, default=50_000)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument(
        "--mix",
        default="1:0.40,2:0.25,4:0.20,8:0.05",
        help="slice request-size mix, COUNT:SHARE,... (default %(default)s)",
    )
    w.add_argument(
        "--baremetal-share",
        type=float,
        default=0.10,
        help="share of requests that lease a whole node (default %(default)s)",
    )
    w.add_argument("--mean-duration", type=float, default=3600.0, help="mean lease seconds")
    w.add_argument(
        "--duration-sigma",
        type=float,
        default=1.0,
        help="lognormal sigma of lease durations; 0 = exponential (default %(default)s)",
    )
    w.add_argument(
        "--lease-terms",
        nargs="?",
        const="1h,24h,7d",
        default=None,
        metavar="TERMS",
        help="write lease_s: the planned use rounded up to these terms, seconds or with an s/m/h/d "
        "suffix (default when given without a value: %(const)s); without: on-demand leases",
    )
    w.add_argument(
        "--early-release",
        type=float,
        default=0.0,
        help="with --lease-terms: share of requests that planned up to 10x longer than they use (default %(default)s)",
    )
    w.set_defaults(func=run_workload)


def _dump(path: Path, doc: dict[str, Any]) -> None:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=False, width=120)
    path.write_text(text, encoding="utf-8")


def run_synth(args: argparse.Namespace) -> int:
    from reconciler.placement import synthesis

    out: Path = args.out
    if args.nodes < 1:
        raise UsageError("--nodes must be at least 1")
    if not 0.0 <= args.amd_share <= 1.0:
        raise UsageError("--amd-share must be between 0 and 1")
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise UsageError(f"{out} is not empty; pass --force to replace the fleet in it")
        for name in _OWNED:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    count = 0
    # fleet.yaml, 2 SKUs, 2 images, then a Node and a SlotMap per host (an MI300X share adds one SKU and image)
    total = 2 * args.nodes + 5 + (2 if args.amd_share else 0)
    with progress.for_args(args, "fleet synth") as shown, shown.phase("write", total, unit="files") as ph:
        for f in synthesis.fleet_documents(args.nodes, amd_share=args.amd_share, seed=args.seed):
            _dump(out / f.path, f.document)
            count += 1
            ph.advance()
    print(f"wrote {count} files for {args.nodes} nodes to {out}")
    return 0


def parse_mix(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    try:
        for part in text.split(","):
            count, share = part.split(":")
            out[int(count)] = float(share)
    except ValueError as e:
        raise UsageError(f"--mix {text!r}: expected COUNT:SHARE,... ({e})") from e
    if not out or any(v < 0 for v in out.values()) or sum(out.values()) <= 0:
        raise UsageError(f"--mix {text!r}: shares must be non-negative and not all zero")
    return out


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_terms(text: str) -> tuple[float, ...]:
    """`1h,24h,7d` -> (3600.0, 86400.0, 604800.0); plain numbers are seconds."""
    out = []
    try:
        for raw in text.split(","):
            part = raw.strip().lower()
            unit = _UNITS.get(part[-1:])
            out.append(float(part[:-1]) * unit if unit is not None else float(part))
    except ValueError as e:
        raise UsageError(f"--lease-terms {text!r}: expected durations such as 1h,24h,7d ({e})") from e
    if not out or any(not 0 < v < float("inf") for v in out) or out != sorted(set(out)):
        raise UsageError(f"--lease-terms {text!r}: terms must be positive and increasing")
    return tuple(out)


def run_workload(args: argparse.Namespace) -> int:
    from reconciler import sources
    from reconciler.placement import simulation, synthesis

    result = sources.load(args.fleet)
    if result.errors:
        raise UsageError(f"{args.fleet} does not validate ({len(result.errors)} errors); run gpuaas validate")
    desired = result.state
    mix = parse_mix(args.mix)
    offers = simulation.offers(desired, mix)
    if not offers:
        raise UsageError(f"{args.fleet} has no slice SKU that any node serves")
    bare = [
        s
        for s in sorted(desired.skus)
        if desired.skus[s].capacity_shape.value == "baremetal"
        and any(n.baremetal_sku == s for n in desired.nodes.values())
    ]
    baremetal = (bare[0], args.baremetal_share) if bare and args.baremetal_share > 0 else None
    terms = parse_terms(args.lease_terms) if args.lease_terms is not None else None
    try:
        rows = synthesis.workload_rows(
            offers,
            load=args.load,
            requests=args.requests,
            seed=args.seed,
            baremetal=baremetal,
            mean_duration_s=args.mean_duration,
            duration_sigma=args.duration_sigma,
        )
        if terms is not None:
            rows = synthesis.lease_terms(rows, terms=terms, early_release=args.early_release, seed=args.seed)
    except ValueError as e:
        raise UsageError(str(e)) from e
    handle = sys.stdout if str(args.out) == "-" else args.out.open("w", newline="", encoding="utf-8")
    try:
        writer = csv.writer(handle)
        if terms is None:
            writer.writerow(synthesis.WORKLOAD_HEADER)
            for r in rows:
                writer.writerow((r.arrival_s, r.duration_s, r.sku, r.gpus))
        else:
            writer.writerow(synthesis.LEASE_HEADER)
            for r in rows:
                writer.writerow((r.arrival_s, r.duration_s, r.sku, r.gpus, r.lease_s))
    finally:
        if handle is not sys.stdout:
            handle.close()
    if handle is not sys.stdout:
        print(f"wrote {len(rows)} requests over {rows[-1].arrival_s:.0f} s to {args.out}", file=sys.stderr)
    return 0
