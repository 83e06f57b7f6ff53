"""`gpuaas host image bench [--size-mib N] [--runs N] [-o text|json]` (root: a loop device).

Registered under `gpuaas host image` by the `host.image.bench` entry point;
light to import, so `gpuaas host ...` pays nothing for it until it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from schemas import output


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="pull throughput vs curl; qcow2 -> raw convert onto a loop device")
    bench.add_argument("--size-mib", type=int, default=1024)
    bench.add_argument("--runs", type=int, default=3)
    output.add_argument(bench, "text")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Pull throughput vs curl on the same file, and qcow2 -> raw onto a loop device (the disk guard on)."""
    from gpuaas_tools.hostbench import images

    out = images.run(size_mib=args.size_mib, runs=args.runs)
    if output.structured(args.output):
        output.emit(out, args.output)
        return 0
    print(f"image: {out['size_bytes']} bytes, {args.runs} run(s) each, same server (127.0.0.1), same session")
    print(f"pull_mib_s   {out['pull_mib_s']:10.1f}   (gpuaas fetch: Range-capable, sha256 while streaming, fsync)")
    print(f"curl_mib_s   {out['curl_mib_s']:10.1f}   (curl -o FILE)")
    print(f"pull/curl    {out['pull_vs_curl']:10.3f}")
    print(f"qcow2_to_raw_ms {out['convert_ms']:10.1f}   (qemu-img convert -O raw onto a loop device, guarded)")
    print(f"write_verify_ms {out['compare_ms']:10.1f}   (qemu-img compare read-back)")
    return 0
