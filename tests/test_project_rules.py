"""Project-wide rules a reviewer would otherwise have to remember."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("desired", "policies", "reconciler", "host_reconciler", "schemas", "tools/gpuaas_tools")
PURE = ("desired", "policies")
DRIVERS = {"psycopg", "libvirt", "pyroute2", "subprocess"}


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def test_no_shell_true_or_os_system_anywhere() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in _sources(*PACKAGES, "tests", "examples")
        if re.search(r"shell\s*=\s*True|os\.system\(", path.read_text()) and path != Path(__file__)
    ]
    assert offenders == []


def test_pure_layers_import_no_driver() -> None:
    """desired/ and policies/ import no psycopg, libvirt, pyroute2 or subprocess (import-linter checks this too)."""
    offenders = []
    for path in _sources(*PURE):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in DRIVERS]
    assert offenders == []


def test_every_package_says_what_it_is_for() -> None:
    for pkg in PACKAGES:
        doc = ast.get_docstring(ast.parse((ROOT / pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 40, pkg


# ------------------------------------------------- argv: data never becomes an option

_SUBPROCESS_RUNNERS = {"run", "Popen", "call", "check_call", "check_output"}
# The host agent's own runners, and which positional argument is the argv.
_HOST_RUNNERS = {("tools", "run"): 0, ("netns", "run"): 1}
# Checks whose result cannot start with '-' (tools.operand refuses it; names match ^[A-Za-z0-9]).
_VALIDATORS = {"operand", "ifname", "mac"}

# Call sites whose argv this rule cannot prove safe, each with the reason it is.
# Key: "path::function" (the function the call is in). A site drops out of here
# once every value in its argv follows a literal "--" (or is a literal).
ARGV_ALLOWED = {
    "tools/gpuaas_tools/bench/applycold.py::_timed": "bench tool: its callers pass sys.executable, literals, an "
    "absolute path and --db-url=<url> as one token",
    "desired/reading/gitrepo.py::_refs": "the value before '--' is commit.hexsha: 40 hex digits from git itself",
    "desired/reading/gitrepo.py::_cat_file": "argv is git's executable, 'cat-file', a mode checked against two "
    "literals and '--buffer'; the object ids go to stdin",
    "tools/gpuaas_tools/bench/claims.py::_pgbench": "bench tool: protocol defaults to a literal, numbers are ints, "
    "the script is a temp path and the URL is the operator's own",
    "tools/gpuaas_tools/bench/gitops.py::_git": "bench tool: every caller in the module passes literal git "
    "subcommands, options and paths it made itself",
    "tools/gpuaas_tools/bench/portal.py::_git": "bench tool: every caller in the module passes literal git "
    "subcommands, options and paths it made itself",
    "tools/gpuaas_tools/bench/portal.py::run": "bench tool: argv is sys.executable, literals, a temp path, a float "
    "and the operator's own database URL",
    "tools/gpuaas_tools/bench/prplan.py::_git": "bench tool: every caller in the module passes literal git "
    "subcommands and options, and commit ids git itself printed",
    "tools/gpuaas_tools/bench/prplan.py::_plan": "bench tool: argv is sys.executable, a literal program, a temp path, "
    "commit ids git printed (hex, never '-') and literal flags",
    "tools/gpuaas_tools/bench/serve.py::_restart": "bench tool: argv is sys.executable, literals and the "
    "scratch database URL this bench made, as one --db-url=URL token",
    "tools/gpuaas_tools/bench/gitops.py::measure": "bench tool: argv is sys.executable, literals, a temp path, "
    "ints and the operator's own database URL",
    "reconciler/store/embedded.py::_run": "runner: pg_ctl/initdb argv built in this module from literals and "
    "paths under the server's state dir",
    "host_reconciler/drivers/netns.py::run": "runner: it passes on the argv its callers give netns.run(ns, argv), "
    "and each of those calls is an argv site of this rule",
    "host_reconciler/drivers/hostroot.py::_run": "runner of `host bootstrap`: its only caller is HostRoot, whose "
    "argv lists are literals with every value after a literal '--'",
    "host_reconciler/drivers/tools.py::run": "runner: it passes on the argv its callers give tools.run(argv), "
    "and each of those calls is an argv site of this rule",
    "host_reconciler/drivers/dnsmasq.py::DnsmasqServer.start": "argv() is the configured binary followed only "
    "by f'--option=...' strings it builds itself",
    **dict.fromkeys(
        (f"host_reconciler/drivers/network.py::IptablesNat.{f}" for f in ("ensure", "remove", "_rule_present")),
        "iptables rule specs from nat_rules(): our literal options around a subnet printed by ipaddress and a "
        "bridge name checked by addresses.ifname, neither of which can start with '-'",
    ),
    "tools/gpuaas_tools/lab/host.py::_run": "lab only: argv from literals, generated netns names and loop devices",
    "tools/gpuaas_tools/hostbench/images.py::_run": "bench tool: every caller passes literals, paths under its own "
    "temp dir and /dev/loopN names printed by losetup",
    "tools/gpuaas_tools/hostbench/images.py::_server_process": "bench tool: sys.executable, a literal module name and "
    "an absolute temp directory it made",
    "tools/gpuaas_tools/hostbench/images.py::_convert": "bench tool: losetup -d of /dev/loopN names losetup printed",
    **dict.fromkeys(
        (f"host_reconciler/drivers/ingress.py::IptablesIngress.{f}" for f in ("_run", "_lines", "_hooked", "_present")),
        "iptables argv of the ingress driver: literal tables and chains (_HOOKS, NAT_CHAIN, FORWARD_CHAIN), rule "
        "specs from dnat_spec/forward_spec (literal options around IPv4 addresses and ints checked by _checked, "
        "a bridge name checked by addresses.ifname) and rule positions (ints)",
    ),
    **dict.fromkeys(
        (f"tools/gpuaas_tools/hostbench/ingress.py::{f}" for f in ("_ip", "_lab")),
        "bench tool: literal ip subcommands, generated netns names (gbi<hex>), literal addresses and device names, "
        "sys.executable and a literal program",
    ),
    "tools/gpuaas_tools/lab/host.py::LabHost.close": "lab only: a generated netns name (gpuaas-l<hex>), mount points "
    "under the lab root (absolute paths) and /dev/loopN names",
}


def _argv_problems(args: list[ast.expr], *, program_first: bool) -> list[str]:
    """Why an argv may let a value become an option ([] when every value is a literal or follows "--")."""
    problems = []
    for i, arg in enumerate(args):
        if isinstance(arg, ast.Constant) and arg.value == "--":
            break
        if i == 0 and program_first:
            continue  # the program itself, not an option
        if not _safe_value(arg):
            problems.append(f"{ast.unparse(arg)!r} can start with '-' and is not after a literal '--'")
    return problems


def _safe_value(arg: ast.expr) -> bool:
    """Whether `arg` (one argv element) can never start with '-'."""
    match arg:
        case ast.Constant():
            safe = True  # a literal we wrote
        case ast.JoinedStr(values=[ast.Constant(value=str() as head), *_]):
            safe = bool(head)  # f"--opt={x}", f"+refs/heads/{b}": starts with our own text
        case ast.Call(func=ast.Attribute(attr=name) | ast.Name(id=name)):
            safe = name in _VALIDATORS  # tools.operand(x), addresses.ifname(x): checked where it runs
        case ast.Starred(value=inner):
            safe = _safe_value(inner)
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            safe = all(_safe_value(e) for e in elts)
        case ast.IfExp(body=body, orelse=orelse):
            safe = _safe_value(body) and _safe_value(orelse)
        case ast.ListComp(elt=elt) | ast.GeneratorExp(elt=elt):
            safe = _safe_value(elt)
        case _:
            safe = False
    return safe


def _argv_sites(tree: ast.Module) -> list[tuple[int, str, list[str]]]:
    """(line, enclosing function, problems) of every subprocess.*, tools.run, netns.run and
    <repo>.git.<cmd>(...) call."""
    found: list[tuple[int, str, list[str]]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                [*scope, child.name]
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                else scope
            )
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                f = child.func
                where = ".".join(scope) or "<module>"
                runner = (f.value.id, f.attr) if isinstance(f.value, ast.Name) else None
                if runner is not None and (
                    runner in _HOST_RUNNERS or (runner[0] == "subprocess" and runner[1] in _SUBPROCESS_RUNNERS)
                ):
                    at = _HOST_RUNNERS.get(runner, 0)
                    argv = (
                        child.args[at]
                        if len(child.args) > at
                        else next((k.value for k in child.keywords if k.arg in ("args", "argv", "command")), None)
                    )
                    if isinstance(argv, ast.List | ast.Tuple):
                        found.append((child.lineno, where, _argv_problems(list(argv.elts), program_first=True)))
                    else:
                        found.append((child.lineno, where, ["argv is built elsewhere; this rule cannot read it"]))
                elif isinstance(f.value, ast.Attribute) and f.value.attr == "git":
                    found.append((child.lineno, where, _argv_problems(list(child.args), program_first=False)))
            visit(child, inner)

    visit(tree, [])
    return found


def test_no_value_can_become_an_option_of_a_program_we_run() -> None:
    """Every subprocess.*, tools.run, netns.run and GitPython repo.git.<cmd>(...) call puts values
    after a literal "--" or through a check that refuses a leading '-'.

    A branch, remote, node or device name that starts with '-' would otherwise
    be read as an option (`git fetch --upload-pack=...`). Literals and
    f-strings that start with our own text are safe; anything else must follow
    a literal "--" or be in ARGV_ALLOWED with the reason it is safe.
    """
    offenders = []
    for path in _sources(*PACKAGES):
        rel = str(path.relative_to(ROOT))
        for line, where, problems in _argv_sites(ast.parse(path.read_text())):
            if problems and f"{rel}::{where}" not in ARGV_ALLOWED:
                offenders += [f"{rel}:{line} ({where}): {p}" for p in problems]
    assert offenders == []
    assert all(len(reason) > 20 for reason in ARGV_ALLOWED.values())


def test_the_argv_rule_catches_what_it_should() -> None:
    cases = {
        'subprocess.run(["git", "fetch", remote])': 1,
        'subprocess.run(["git", "fetch", "--", remote, f"+refs/heads/{b}"])': 0,
        'subprocess.run(["umount", "-l", str(point)])': 1,
        "subprocess.run(argv)": 1,
        'subprocess.run([binary, "-x", f"--db={db}"])': 0,
        'repo.git.fetch(self.remote, "main")': 1,
        'repo.git.fetch("--", self.remote, "main")': 0,
        'repo.git.checkout("-b", "pr")': 0,
        "repo.git.log(*args)": 1,
        'tools.run(["wipefs", "--all", dev.path])': 1,
        'tools.run(["wipefs", "--all", "--", dev.path], timeout=9)': 0,
        "tools.run(argv)": 1,
        'netns.run(ns, ["ip", "link", "del", name], code="x")': 1,
        'netns.run(ns, ("sysctl", "-n", "net.ipv4.ip_forward"), code="x")': 0,
        "netns.run(ns, [b, addresses.ifname(br), tools.operand(ip), *([] if c is None else [operand(c)])])": 0,
        "netns.run(ns, [b, x, *([] if c is None else [c])])": 2,
        "netns.run(ns, [b, *rest])": 1,
    }
    for code, expected in cases.items():
        sites = _argv_sites(ast.parse(code))
        assert len(sites) == 1 and len(sites[0][2]) == expected, (code, sites)
