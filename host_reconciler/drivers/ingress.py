"""Tenant ingress on iptables: a public address:port DNAT'd to a slice VM's private address.

Two chains of our own, so a read-back lists exactly our rules and nothing is
ever matched by position in someone else's chain:

- `nat GPUAAS-INGRESS`, jumped to from PREROUTING: one DNAT per endpoint,
  `-d PUBLIC/32 -p tcp --dport PORT -j DNAT --to-destination PRIVATE:GUEST`;
- `filter GPUAAS-INGRESS-FWD`, jumped to from the top of FORWARD: one ACCEPT per
  endpoint for new connections into the bridge that conntrack says were DNAT'd
  from exactly that public address and port (`--ctstate DNAT --ctorigdst
  --ctorigdstport`), and never for traffic entering from the bridge
  (`! -i BRIDGE`): a VM reaching a neighbour's public endpoint is routed
  bridge-to-bridge and still meets the management network's DROP (east-west
  isolation unchanged). Replies ride the existing RELATED,ESTABLISHED rule and
  the reverse NAT of conntrack.

Each rule carries the comment `gpuaas-ingress:<allocation id>`; a rule in our
chains without it, or that does not parse as ours, is foreign. Every command
is an argv list (no shell); values come from the host plan (addresses and
ports the central reconciler chose and typed), never from YAML text.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Sequence

from host_reconciler import codes as host_codes
from host_reconciler.drivers import addresses, netns
from host_reconciler.observations import IngressSeen
from schemas.errors import PermanentError
from schemas.hostplans import IngressRule

NAT_CHAIN = "GPUAAS-INGRESS"
FORWARD_CHAIN = "GPUAAS-INGRESS-FWD"
TAG = "gpuaas-ingress:"
_CODE = host_codes.INGRESS_IPTABLES_FAILED
# (table, built-in chain, our chain): where our chains are reached from.
_HOOKS = (("nat", "PREROUTING", NAT_CHAIN), ("filter", "FORWARD", FORWARD_CHAIN))


class IngressError(PermanentError):
    code = host_codes.INGRESS_INVALID


def _checked(rule: IngressRule) -> IngressRule:
    """Refuse values that are not an address and ports (defence in depth: the plan is typed)."""
    try:
        ipaddress.IPv4Address(rule.public_address)
        ipaddress.IPv4Address(rule.private_ip)
    except ValueError as e:
        raise IngressError(f"ingress of {rule.allocation_id}: {e}") from e
    if not (1 <= rule.public_port <= 65535 and 1 <= rule.guest_port <= 65535):
        raise IngressError(f"ingress of {rule.allocation_id}: port out of range")
    if not rule.allocation_id or any(not (c.isalnum() or c == "-") for c in rule.allocation_id):
        raise IngressError(f"ingress: allocation id {rule.allocation_id!r} cannot be a rule tag")
    return rule


def dnat_spec(rule: IngressRule) -> tuple[str, ...]:
    r = _checked(rule)
    return (
        "-d",
        f"{r.public_address}/32",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        str(r.public_port),
        "-m",
        "comment",
        "--comment",
        f"{TAG}{r.allocation_id}",
        "-j",
        "DNAT",
        "--to-destination",
        f"{r.private_ip}:{r.guest_port}",
    )


def forward_spec(bridge: str, rule: IngressRule) -> tuple[str, ...]:
    r = _checked(rule)
    bridge = addresses.ifname(bridge)
    return (
        "-d",
        f"{r.private_ip}/32",
        "!",
        "-i",
        bridge,
        "-o",
        bridge,
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        str(r.guest_port),
        "-m",
        "conntrack",
        "--ctstate",
        "DNAT",
        "--ctorigdst",
        f"{r.public_address}/32",
        "--ctorigdstport",
        str(r.public_port),
        "-m",
        "comment",
        "--comment",
        f"{TAG}{r.allocation_id}",
        "-j",
        "ACCEPT",
    )


def _options(tokens: Sequence[str]) -> dict[str, str]:
    """`--opt value` / `-o value` pairs of one rule (a `!` before an option is kept in its key)."""
    out: dict[str, str] = {}
    neg = False
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "!":
            neg = True
        elif t.startswith("-") and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            out[("!" if neg else "") + t] = tokens[i + 1]
            neg = False
            i += 1
        i += 1
    return out


def _host(value: str | None) -> str | None:
    return value.removesuffix("/32") if value else None


def parse(table: str, line: str) -> IngressRule | None:
    """The endpoint a rule of our chain in `table` realises, or None when it is not one of ours."""
    try:
        tokens = shlex.split(line)
    except ValueError:
        return None
    opts = _options(tokens[2:])  # after "-A CHAIN"
    tag = opts.get("--comment", "")
    if not tag.startswith(TAG) or opts.get("-p") != "tcp":
        return None
    alloc = tag[len(TAG) :]
    try:
        if table == "nat" and opts.get("-j") == "DNAT":
            ip, _, guest = opts["--to-destination"].rpartition(":")
            return IngressRule(alloc, str(_host(opts["-d"])), int(opts["--dport"]), ip, int(guest))
        if table == "filter" and opts.get("-j") == "ACCEPT" and opts.get("--ctstate") == "DNAT":
            return IngressRule(
                alloc,
                str(_host(opts["--ctorigdst"])),
                int(opts["--ctorigdstport"]),
                str(_host(opts["-d"])),
                int(opts["--dport"]),
            )
    except (KeyError, ValueError):
        return None
    return None


class IptablesIngress:
    """IngressDriver on iptables (legacy or nft backend alike), in `netns` or the host."""

    def __init__(self, netns_name: str | None = None, *, iptables: str = "iptables") -> None:
        self._netns = netns.checked(netns_name)
        self._iptables = iptables

    def _run(self, *args: str, ok: Sequence[int] = (0,)) -> str:
        return netns.run(self._netns, (self._iptables, "-w", *args), code=_CODE, ok=ok).stdout

    def _lines(self, table: str, chain: str) -> list[str] | None:
        """`-A` lines of our chain, or None when the chain does not exist."""
        done = netns.run(self._netns, (self._iptables, "-w", "-t", table, "-S", chain), code=_CODE, ok=(0, 1))
        if done.returncode != 0:
            return None
        return [line for line in done.stdout.splitlines() if line.startswith("-A ")]

    def _hooked(self, table: str, builtin: str, chain: str) -> bool:
        done = netns.run(
            self._netns, (self._iptables, "-w", "-t", table, "-C", builtin, "-j", chain), code=_CODE, ok=(0, 1, 2)
        )
        return done.returncode == 0

    def observe(self) -> IngressSeen:
        found: dict[str, list[IngressRule]] = {"nat": [], "filter": []}
        foreign: list[str] = []
        hooked = True
        for table, builtin, chain in _HOOKS:
            lines = self._lines(table, chain)
            if lines is None:
                hooked = False
                continue
            hooked = hooked and self._hooked(table, builtin, chain)
            for line in lines:
                rule = parse(table, line)
                if rule is None:
                    foreign.append(f"{table} {line}")
                else:
                    found[table].append(rule)
        return IngressSeen(
            dnat=tuple(sorted(found["nat"], key=_order)),
            forward=tuple(sorted(found["filter"], key=_order)),
            foreign=tuple(foreign),
            hooked=hooked,
        )

    def _ensure_chains(self) -> bool:
        changed = False
        for table, builtin, chain in _HOOKS:
            if self._lines(table, chain) is None:
                self._run("-t", table, "-N", chain)
                changed = True
            if not self._hooked(table, builtin, chain):
                self._run("-t", table, "-I", builtin, "1", "-j", chain)
                changed = True
        return changed

    def _present(self, table: str, chain: str, spec: Sequence[str]) -> bool:
        done = netns.run(self._netns, (self._iptables, "-w", "-t", table, "-C", chain, *spec), code=_CODE, ok=(0, 1, 2))
        return done.returncode == 0

    def add(self, bridge: str, rule: IngressRule) -> bool:
        changed = self._ensure_chains()
        for table, chain, spec in (
            ("nat", NAT_CHAIN, dnat_spec(rule)),
            ("filter", FORWARD_CHAIN, forward_spec(bridge, rule)),
        ):
            if not self._present(table, chain, spec):
                self._run("-t", table, "-A", chain, *spec)
                changed = True
        return changed

    def delete(self, rule: IngressRule) -> bool:
        """Every rule of ours that realises `rule`, whatever bridge it names (read back, then deleted)."""
        changed = False
        for table, chain in (("nat", NAT_CHAIN), ("filter", FORWARD_CHAIN)):
            for line in self._lines(table, chain) or ():
                if parse(table, line) == rule:
                    changed |= self._delete_line(table, line)
        return changed

    def delete_foreign(self, line: str) -> bool:
        table, _, rest = line.partition(" ")
        if table not in ("nat", "filter") or parse(table, rest) is not None:
            raise IngressError(f"not a foreign rule of our chains: {line!r}", code=host_codes.INGRESS_NOT_FOREIGN)
        return self._delete_line(table, rest)

    def _delete_line(self, table: str, line: str) -> bool:
        tokens = shlex.split(line)
        chain = tokens[1] if len(tokens) > 1 and tokens[0] == "-A" else ""
        if chain not in (NAT_CHAIN, FORWARD_CHAIN):
            raise IngressError(f"not a rule of our chains: {line!r}", code=host_codes.INGRESS_NOT_OURS)
        # By position, found again just now: a spec printed by `-S` does not always match back with `-D`
        # (iptables-nft prints --ctorigdst without its /32). The host lock keeps other writers of our chains out.
        lines = self._lines(table, chain) or []
        if line not in lines:
            return False
        self._run("-t", table, "-D", chain, str(lines.index(line) + 1))
        return True


def _order(rule: IngressRule) -> tuple[str, str, int]:
    return (rule.allocation_id, rule.public_address, rule.public_port)
