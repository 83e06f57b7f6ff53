"""`gpuaas host discover` and `gpuaas host gate`.

discover: read the host (or a recorded tree with --sysfs-root) and print a
candidate SlotMap with approval_required: true. It never writes a file:
redirect the output into the fleet repo and open a pull request.

gate: decide, slot by slot, whether an approved SlotMap file may be sold on
this host: the eligibility `gpuaas validate` applies, then the drift from the
host. Exit status 0 when every slot is in service, 3 when at least one is
ineligible or drifted (1 stays reserved for errors).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host_reconciler import codes as host_codes
from schemas import output
from schemas.errors import PermanentError, UsageError

if TYPE_CHECKING:
    from desired import models as m

EXIT_BLOCKED = 3
SLOTMAP_INVALID = host_codes.GATE_SLOTMAP_INVALID


def register(sub: Any) -> None:
    from host_reconciler.discovery import candidates

    p = sub.add_parser("discover", help="print a candidate slot map from this host's sysfs (never approves)")
    _common(p)
    p.add_argument("--node", help="node name for the slot map and MAC derivation (default: the host name)")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument(
        "--wipe-policy",
        default=candidates.DEFAULT_WIPE_POLICY,
        help="destructive_wipe_policy proposed for clean slot disks (default: %(default)s)",
    )
    p.set_defaults(func=run_discover)

    g = sub.add_parser("gate", help="compare an approved slot map with this host; report drift per slot")
    g.add_argument("slotmap", type=Path, help="the approved SlotMap YAML file")
    _common(g)
    output.add_argument(g, "text")
    g.set_defaults(func=run_gate)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sysfs-root",
        default="/",
        metavar="DIR",
        help="root holding sys/, dev/ and proc/ (default: /; a recorded tree for tests)",
    )


def _node(args: argparse.Namespace, hostname: str | None) -> str:
    from desired import models as m
    from host_reconciler.discovery import candidates

    if args.node is not None:
        if not re.match(m.NAME_RE, args.node):
            raise UsageError(
                f"--node {args.node!r}: use lowercase letters, digits, '.', '_' or '-'",
                code=candidates.NODE_INVALID,
            )
        return str(args.node)
    return (hostname or "").lower()


def run_discover(args: argparse.Namespace) -> int:
    from desired import models as m
    from host_reconciler.discovery import candidates, discovering, rendering

    discovery = discovering.discover(args.sysfs_root)
    node = _node(args, discovery.hostname)
    if not discovery.gpus and args.node is None:
        node = node if re.match(m.NAME_RE, node) else "unnamed"
    candidate = candidates.candidate_map(discovery, node=node, wipe_policy=args.wipe_policy)
    render = rendering.to_json if args.output == "json" else rendering.to_yaml
    sys.stdout.write(render(candidate, discovery))
    return 0


def load_slot_map(path: Path) -> m.SlotMap:
    from desired.reading import loading
    from schemas import inputfiles

    data = inputfiles.read_bytes(path, limit=16 * inputfiles.MIB, code=SLOTMAP_INVALID, what="slot map")
    result = loading.parse_files([(str(path), data)])
    if result.errors:
        raise PermanentError("; ".join(x.render() for x in result.errors[:5]), code=SLOTMAP_INVALID)
    maps = list(result.state.slot_maps.values())
    if len(maps) != 1:
        raise PermanentError(f"{path}: expected one SlotMap document, found {len(maps)}", code=SLOTMAP_INVALID)
    return maps[0]


def run_gate(args: argparse.Namespace) -> int:
    from host_reconciler.discovery import discovering, gating

    approved = load_slot_map(args.slotmap)
    result = gating.gate(approved, discovering.discover(args.sysfs_root))
    if output.structured(args.output):
        output.emit(result.as_dict(), args.output)
    else:
        for index, reasons in sorted(result.ineligible.items()):
            for r in reasons:
                print(f"slot {index}: ineligible: {r.code}: {r.field}: {r.message}")
        for drift in result.drifts:
            print(
                f"slot {drift.slot_index}: blocked: {drift.code}: {drift.field}: "
                f"{drift.old!r} -> {drift.new!r}: {drift.message}"
            )
        print(
            f"{result.node}: {len(result.schedulable)} slot(s) in service, "
            f"{len(result.unschedulable)} blocked ({len(result.ineligible)} ineligible by policy, "
            f"{len(result.blocked)} drifted from the host)"
            + (f"; GPUs not in the approved map: {', '.join(result.unapproved_gpus)}" if result.unapproved_gpus else "")
        )
    return EXIT_BLOCKED if result.unschedulable else 0
