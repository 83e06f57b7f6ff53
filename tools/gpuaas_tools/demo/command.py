"""`gpuaas demo [PATH]`: the main job `make demo` runs on the example fleet.

Each step prints a heading and its result, so an operator can read the demo
as the story of one reconciliation.

Without PATH the demo runs on ./examples/fleet (a source checkout) or else on
the copy of it gpuaas-tools ships (`gpuaas_tools/demo/example-fleet`, the
files themselves in an installed wheel), and says which.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from schemas.errors import PermanentError


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the main job on an example fleet")
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        type=Path,
        help="a desired-state directory (default: ./examples/fleet, else the example fleet shipped with the package)",
    )
    p.set_defaults(func=run)


def example_fleet() -> Path:
    """./examples/fleet when run from a checkout, else the example fleet installed with the package."""
    here = Path("examples/fleet")
    if here.is_dir():
        return here
    from importlib import resources

    # resolve(): in a checkout the shipped copy is a link to examples/fleet, and the loader enters no link.
    return Path(str(resources.files("gpuaas_tools.demo") / "example-fleet")).resolve()


def _heading(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def run(args: argparse.Namespace) -> int:
    from reconciler import sources
    from reconciler.reports import summary

    if args.path is None:
        args.path = example_fleet()
        print(f"gpuaas demo: no PATH given: running on the example fleet at {args.path}")
    _heading(f"validate {args.path}")
    result = sources.load(args.path)
    for problem in result.problems:
        print(problem.render())
    if result.errors:
        raise PermanentError(f"{len(result.errors)} validation error(s) in {args.path}", code="demo.invalid")
    _heading("fleet summary")
    print(summary.render_text(summary.fleet_summary(result.state)))
    _claims_demo(args.path)
    _gitops_demo(args.path)
    _baremetal_demo(args.path)
    _host_demo(args.path)
    return 0


def _claims_demo(fleet: Path) -> None:
    """Embedded PostgreSQL, the fleet applied as claims (placements, pending reasons), re-applied, checked."""
    from gpuaas_tools.demo import claims as claims_demo

    claims_demo.run(fleet)


def _gitops_demo(fleet: Path) -> None:
    """A PR's plan in markdown, the merge applied by the reconciler loop, then status (gpuaas_tools.demo.gitops)."""
    from gpuaas_tools.demo import gitops as gitops_demo
    from reconciler.store import connections

    gitops_demo.run(fleet, connections.database_url())


def _baremetal_demo(fleet: Path) -> None:
    """A lease deployed and released on a local Ironic, then alloc-0004 left active (gpuaas_tools.demo.baremetal)."""
    from gpuaas_tools.demo import baremetal as baremetal_demo
    from gpuaas_tools.demo import claims as claims_demo
    from reconciler.store import connections, embedded

    scratch = None if connections.external_url() else embedded.ensure(connections.state_dir()).url(claims_demo.DEMO_DB)
    baremetal_demo.run(fleet, connections.database_url(), scratch)


def _host_demo(fleet: Path) -> None:
    """Two example nodes' host reconcilers converge, drift, report (needs root: loop devices, a netns)."""
    from gpuaas_tools.demo import hosts as host_demo
    from gpuaas_tools.lab import host as lab

    try:
        lab.check_host()
    except PermanentError as e:
        _heading("host reconcilers")
        print(f"skipped: {e.code}: {e.message}")
        return
    from reconciler.store import connections

    host_demo.run_demo(connections.database_url(), fleet=fleet)
