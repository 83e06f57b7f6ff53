"""`gpuaas host bootstrap --check|--apply`: onboard a deployed host (seed 003 section 2).

    gpuaas host bootstrap --check [--root DIR] [--hugepages-1g N] [--sysctl-tuning] [-o text|json|yaml]
    gpuaas host bootstrap --apply [...]

`--check` reads the host and prints every check and every change `--apply`
would make, in order; it changes nothing (it writes no state either).
`--apply` makes those changes, reads the host again, and records the result
in `<bootstrap_dir>/state.json`, which the host agent reports (bootstrap
state, reboot_required). A kernel-argument change needs a reboot: reported,
never done. Exit status: 0 ready, 3 something left (changes pending, a
reboot, or a check bootstrap cannot fix), 1 an error.

`--root DIR` reads and writes under DIR instead of `/` (a throwaway root in
tests); commands are then listed as deferred, not run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from host_reconciler import codes as host_codes
from schemas import output
from schemas.errors import GpuaasError, UsageError

EXIT_NOT_READY = 3


def register(sub: Any) -> None:
    p = sub.add_parser("bootstrap", help="check or apply the deployed-host bootstrap (seed 003 §2)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="list every check and change; change nothing")
    what.add_argument("--apply", action="store_true", help="make the listed changes (never reboots)")
    p.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="host root to read and write (default: /); commands run only on /",
    )
    p.add_argument("--config", type=Path, help="host settings JSON (state, image and bootstrap directories)")
    p.add_argument(
        "--hugepages-1g",
        type=int,
        default=0,
        metavar="N",
        help="1 GiB hugepages the slice runtime profile needs (default: 0, none)",
    )
    p.add_argument(
        "--sysctl-tuning",
        action="store_true",
        help="also apply the network sysctl tuning set (after benchmark approval)",
    )
    output.add_argument(p, "text")
    p.set_defaults(func=run_bootstrap)


def _options(args: argparse.Namespace) -> tuple[Any, Path]:
    from host_reconciler import bootstrapping, settings

    if args.hugepages_1g < 0 or args.hugepages_1g > 4096:
        raise UsageError(f"--hugepages-1g {args.hugepages_1g}: give 0-4096", code=host_codes.BOOTSTRAP_INVALID_OPTION)
    s = settings.load("bootstrap", args.config)
    traverse = tuple(dict.fromkeys(str(p) for p in (s.state_dir.parent, s.state_dir, s.image_dir)))
    opts = bootstrapping.Options(
        hugepages_1g=args.hugepages_1g,
        sysctl_tuning=args.sysctl_tuning,
        traverse=traverse,
        hosts_dir=str(s.dnsmasq_dir / "hosts"),
    )
    return opts, s.bootstrap_dir


def run_bootstrap(args: argparse.Namespace) -> int:
    from host_reconciler import bootstrapping, onboarding
    from host_reconciler.drivers import hostroot

    if not args.root.is_dir():
        raise UsageError(f"--root {args.root}: not a directory", code=host_codes.BOOTSTRAP_INVALID_OPTION)
    opts, state_dir = _options(args)
    state_dir = args.root / str(state_dir).lstrip("/")
    previous = onboarding.read_state(state_dir) or {}
    got = previous.get("written")
    written: dict[str, Any] = got if isinstance(got, dict) else {}
    driver = hostroot.HostRoot(args.root, written={str(k): str(v) for k, v in written.items()})
    before = bootstrapping.plan(driver.facts(opts), opts)
    if args.check:
        _print({**before.as_dict(), "mode": "check", "root": str(args.root)}, args.output)
        return 0 if before.state is bootstrapping.State.READY else EXIT_NOT_READY
    done, error = apply(driver, before, opts)
    after = bootstrapping.plan(driver.facts(opts), opts)
    boot = onboarding.boot_id(args.root / "proc/sys/kernel/random/boot_id")
    doc = onboarding.write_state(state_dir, after, written=driver.written, error=error, applied=True, boot=boot)
    _print(
        {
            **doc,
            "mode": "apply",
            "root": str(args.root),
            "applied": done,
            "planned": [c.describe() for c in before.changes],
        },
        args.output,
    )
    if error:
        return 1
    return 0 if after.state is bootstrapping.State.READY else EXIT_NOT_READY


def apply(driver: Any, plan: Any, opts: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Make the plan's changes in order; stop at the first that fails (its code and message returned)."""
    done: list[dict[str, Any]] = []
    for change in plan.changes:
        try:
            evidence = driver.apply(change, opts)
        except (GpuaasError, OSError) as e:
            code = e.code if isinstance(e, GpuaasError) else host_codes.BOOTSTRAP_IO_ERROR
            message = e.message if isinstance(e, GpuaasError) else str(e)
            return done, f"{code}: {change.describe()}: {message}"
        done.append({"change": change.describe(), **evidence})
    return done, None


def _print(doc: dict[str, Any], fmt: str) -> None:
    if output.structured(fmt):
        output.emit(doc, fmt)
        return
    print(
        f"bootstrap {doc['mode']} of {doc['root']}: {doc['state']}"
        + ("  (reboot required: reported, not done)" if doc["reboot_required"] else "")
    )
    for c in doc["checks"]:
        code = f" [{c['code']}]" if c["code"] else ""
        print(f"  {c['outcome']:8} {c['name']:20} {c['detail']}{code}")
    if doc["mode"] == "apply":
        print(f"changes made: {len(doc['applied'])} of {len(doc['planned'])}")
        for i, ch in enumerate(doc["applied"], 1):
            print(f"  {i}. {ch['change']}" + ("  (deferred: not the live root)" if "deferred" in ch else ""))
    print(f"changes --apply would make{' now' if doc['mode'] == 'apply' else ''}: {len(doc['changes'])}")
    for i, ch in enumerate(doc["changes"], 1):
        print(f"  {i}. {ch}")
    if doc.get("error"):
        print(f"error: {doc['error']}")
