"""`gpuaas host image ...`: the host's image cache by hand (pull, list, evict).

    gpuaas host image pull --url URL --digest sha256:HEX [--cache DIR] [--max-bytes N] [-o text|json]
    gpuaas host image list [--cache DIR] [-o text|json]
    gpuaas host image evict [--cache DIR] [--digest sha256:HEX ...] [--to-bytes N] [-o text|json]

`--cache` defaults to the host settings' `image_dir` (--config or
$GPUAAS_HOST_CONFIG), `--max-bytes` to its `image_max_bytes` (64 GiB).
`pull` prints the cached path; on a digest mismatch, an image over the cap or
an HTTP error it exits 1 with the code and leaves nothing in the cache (no
partial file, no entry). `evict` never removes an image a provision on this
host recorded (its journal under the settings' state dir) nor a pinned one
(`image_pins`); `--digest` removes the named ones, `--to-bytes` the least
recently used until the cache fits, and with neither it enforces the budget.
`gpuaas host image bench` comes with the tools (gpuaas_tools.hostbench.images).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler import fetching, imagecache, settings
from host_reconciler.localstate import LocalState
from schemas import output, plugins, progress
from schemas.errors import GpuaasError, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("image", help="the host image cache: pull, list, evict (and bench, with the tools)")
    isub = p.add_subparsers(dest="image_command", metavar="IMAGE_COMMAND")
    isub.required = True

    pull = isub.add_parser("pull", help="fetch and verify an image into the cache; print its path")
    pull.add_argument("--url", required=True, help="http(s):// or file:// URL of the image")
    pull.add_argument("--digest", required=True, help="sha256:HEX the image must hash to")
    pull.add_argument("--max-bytes", type=int, help="refuse a larger image (default: settings, 64 GiB)")
    progress.add_argument(pull)
    pull.set_defaults(func=run_pull)

    ls = isub.add_parser("list", help="the cached images, least recently used first")
    ls.set_defaults(func=run_list)

    ev = isub.add_parser("evict", help="remove cached images (never in-use or pinned ones)")
    ev.add_argument("--digest", action="append", default=[], help="sha256:HEX to remove (repeatable)")
    ev.add_argument("--to-bytes", type=int, help="remove least recently used images until the cache fits N bytes")
    ev.set_defaults(func=run_evict)

    for q in (pull, ls, ev):
        q.add_argument("--cache", type=Path, help="cache directory (default: the settings' image_dir)")
        q.add_argument("--config", type=Path, help=f"host settings JSON (default ${settings.ENV_CONFIG})")
    for q in (pull, ls, ev):
        output.add_argument(q, "text")
    plugins.register(isub, "host.image")


def _settings(args: argparse.Namespace) -> settings.HostSettings:
    return settings.load("local", getattr(args, "config", None))


def _cache(args: argparse.Namespace, s: settings.HostSettings) -> imagecache.ImageCache:
    return imagecache.ImageCache(args.cache or s.image_dir)


def run_pull(args: argparse.Namespace) -> int:
    s = _settings(args)
    cache = _cache(args, s)
    max_bytes = args.max_bytes if args.max_bytes is not None else s.image_max_bytes
    if max_bytes <= 0:
        raise UsageError("--max-bytes must be positive", code=host_codes.IMAGE_BAD_CAP)
    try:
        # Progress on stderr (a live line on a terminal, periodic lines otherwise): stdout keeps the path or JSON.
        with progress.for_args(args, "image pull") as shown, shown.phase("fetch", unit="bytes") as ph:

            def seen(done: int, total: int | None) -> None:
                ph.done, ph.total = done, total

            result = fetching.fetch(
                cache,
                args.url,
                args.digest,
                max_bytes=max_bytes,
                timeout_s=s.image_fetch_timeout_s,
                progress=seen,
                keep_partial=False,
            )
    except GpuaasError as e:
        if output.structured(args.output):
            output.emit({"error": {"code": e.code, "message": e.message}}, args.output, indent=None)
            return 1
        raise
    if output.structured(args.output):
        output.emit(result.as_dict(), args.output)
    else:
        print(result.entry.path)
    return 0


def _catalog_pins(s: settings.HostSettings) -> set[str]:
    """Digests the catalog pinned in the agent's last plan (its local state records them)."""
    return LocalState(s.state_dir).read_image_pins() if s.state_dir.is_dir() else set()


def _in_use(s: settings.HostSettings) -> set[str]:
    """Digests recorded by a provision journal on this host (an allocation this host still knows)."""
    state = LocalState(s.state_dir)
    if not s.state_dir.is_dir():
        return set()
    found: set[str] = set()
    for alloc in state.journal_allocations():
        image = state.read_journal(alloc).get("image")
        if isinstance(image, dict) and isinstance(image.get("digest"), str):
            found.add(image["digest"])
    return found


def run_list(args: argparse.Namespace) -> int:
    s = _settings(args)
    cache = _cache(args, s)
    entries = sorted(cache.entries(), key=lambda e: (e.last_used, e.digest))
    partials = cache.partials()
    if output.structured(args.output):
        output.emit(
            {
                "cache": str(cache.root),
                "used_bytes": sum(e.size for e in entries),
                "images": [e.as_dict() for e in entries],
                "fetching": [f.as_dict() for f in partials],
            },
            args.output,
        )
        return 0
    print(f"{cache.root}: {len(entries)} image(s), {sum(e.size for e in entries)} bytes")
    for e in entries:
        print(f"  sha256:{e.digest}  {e.size:>14}  last used {e.as_dict()['last_used']}")
    for f in partials:
        print(f"  sha256:{f.digest}  partial {f.bytes_done}/{f.total if f.total is not None else '?'}")
    return 0


def run_evict(args: argparse.Namespace) -> int:
    s = _settings(args)
    cache = _cache(args, s)
    keep = _in_use(s) | set(s.image_pins) | _catalog_pins(s)
    refused: list[dict[str, str]] = []
    evicted: list[str] = []
    if args.digest:
        for d in args.digest:
            hexd = imagecache.digest_hex(d)
            if hexd in keep:
                refused.append({"digest": f"sha256:{hexd}", "why": "in use or pinned"})
            elif cache.evict(hexd):
                evicted.append(hexd)
            else:
                refused.append({"digest": f"sha256:{hexd}", "why": "not cached, or busy"})
    else:
        budget = args.to_bytes if args.to_bytes is not None else s.image_budget()
        evicted = cache.enforce(budget=budget, in_use=keep, pinned=())
    if output.structured(args.output):
        output.emit(
            {"evicted": [f"sha256:{d}" for d in evicted], "refused": refused, "used_bytes": cache.used_bytes()},
            args.output,
        )
    else:
        for d in evicted:
            print(f"evicted sha256:{d}")
        for r in refused:
            print(f"kept {r['digest']}: {r['why']}", file=sys.stderr)
    return 1 if refused else 0
