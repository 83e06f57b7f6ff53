"""DHCP for the management bridge: one dnsmasq, one reservation file per VM.

Seed 002: the slot row's MAC and private IP are the source of truth, and
dnsmasq holds a per-VM MAC→IP reservation. Here each VM has one file in the
hosts directory (`--dhcp-hostsdir`), named after the VM, holding one line
`MAC,IP,name` (the dhcp-host syntax without the `dhcp-host=` prefix).

dnsmasq reads new or changed files in that directory by itself (inotify), but
a host record it has read stays until SIGHUP, so the driver sends SIGHUP after
every write and every removal; that is what makes a change or a delete take
effect. Files are written atomically (a dotfile, which dnsmasq ignores, then
rename). Removing a reservation also releases its lease (`dhcp_release`), so
a released slot leaves no lease behind that a later readiness check of the
same MAC would mistake for the new guest's.

The managed dnsmasq serves DHCP only (`--port=0`), on the bridge only
(`--bind-interfaces --interface=BR`), and by default only to reserved MACs
(`static` range), so an unknown MAC on the bridge gets no address at all.
It runs as a daemon with a pid file in its state dir, so it outlives a host
reconciler restart; `start` finds it there and does nothing.

dnsmasq started as root drops to an unprivileged user (`nobody` unless told
otherwise) before it reads the hosts dir, and it reads that dir again on
every SIGHUP: a hosts dir that user cannot reach is "bad dynamic directory
...: Permission denied" in its log and no reservation is ever served. So
`start` makes the dir reachable: the dnsmasq dir and its hosts dir are 0755,
and the dnsmasq dir's parent (the host's state dir, 0700 on every lab and
demo host) gets the search bit for others only (o+x: a name inside can be
reached, nothing can be listed; the host's other state dirs stay 0700).
Where a directory higher up still bars that user (one we do not own), the
user is chosen explicitly instead: dnsmasq keeps the hosts dir owner's
identity (`runs_as` says which).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import re
import signal
import stat
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from host_reconciler import codes as host_codes
from host_reconciler.drivers import addresses, netns, tools
from host_reconciler.drivers.protocols import DhcpError, Lease, Reservation
from schemas.errors import TemporaryError
from schemas.hostplans import Network

_CLIENT_ID = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2})*$")
DEFAULT_USER = "nobody"  # dnsmasq's compiled-in user when run as root without --user
_LEASE_TIME = re.compile(r"^([1-9][0-9]{0,6}[smhdw]?|infinite)$")


class DhcpServerDown(TemporaryError):
    code = host_codes.DHCP_SERVER_DOWN


def parse_reservation(text: str) -> Reservation | None:
    """Parse a reservation file; None when it is not exactly one `MAC,IP,name` line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if len(lines) != 1:
        return None
    parts = lines[0].split(",")
    if len(parts) != 3:
        return None
    try:
        return Reservation(name=parts[2], mac=parts[0], ip=parts[1])
    except addresses.InvalidNetworkValue:
        return None


def parse_leases(text: str) -> tuple[Lease, ...]:
    """Parse dnsmasq's lease file: `EXPIRY MAC IP HOSTNAME CLIENT-ID` per line."""
    found: list[Lease] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[0] == "duid":
            continue
        try:
            expires = int(parts[0])
            mac = addresses.mac(parts[1])
            ip = str(ipaddress.IPv4Address(parts[2]))
        except (ValueError, addresses.InvalidNetworkValue):
            continue
        client_id = parts[4] if len(parts) > 4 and _CLIENT_ID.match(parts[4]) else None
        found.append(Lease(expires, mac, ip, None if parts[3] == "*" else parts[3], client_id))
    return tuple(found)


def read_leases(path: Path) -> tuple[Lease, ...]:
    try:
        return parse_leases(path.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return ()


class DnsmasqServer:
    """One managed dnsmasq for one bridge, with its state under `state_dir`.

    state_dir/hosts/           reservation files (--dhcp-hostsdir)
    state_dir/dnsmasq.leases   lease file (--dhcp-leasefile)
    state_dir/dnsmasq.pid      pid file
    state_dir/dnsmasq.log      log (DHCP transactions included)
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        netns_name: str | None = None,
        binary: str = "dnsmasq",
        release_binary: str = "dhcp_release",
        lease_time: str = "12h",
        dynamic: bool = False,
        dns_servers: Sequence[str] = (),
        no_ping: bool = False,
        user: str | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.hosts_dir = state_dir / "hosts"
        self.lease_file = state_dir / "dnsmasq.leases"
        self.pid_file = state_dir / "dnsmasq.pid"
        self.log_file = state_dir / "dnsmasq.log"
        self._netns = netns.checked(netns_name)
        self._binary = binary
        self._release_binary = release_binary
        if not _LEASE_TIME.match(lease_time):
            raise DhcpError(f"not a dnsmasq lease time: {lease_time!r}", code=host_codes.DHCP_LEASE_TIME)
        self._lease_time = lease_time
        self._dynamic = dynamic
        self._dns = tuple(str(addresses.ipv4(d)) for d in dns_servers)
        self._no_ping = no_ping
        self._user = user
        self.runs_as = user or DEFAULT_USER  # the user dnsmasq runs as (start may choose another one)

    def argv(self, network: Network) -> list[str]:
        net = addresses.subnet(network)
        if self._dynamic:
            pool = f"{network.dhcp_start},{network.dhcp_end},{net.netmask},{self._lease_time}"
        else:
            pool = f"{net.network_address},static,{net.netmask},{self._lease_time}"
        args = [
            self._binary,
            "--conf-file=/dev/null",  # nothing from /etc/dnsmasq.conf
            "--port=0",  # DHCP only; DNS is not ours to serve
            "--bind-interfaces",
            f"--interface={network.bridge}",
            "--except-interface=lo",
            f"--dhcp-range={pool}",
            f"--dhcp-option=option:router,{network.gateway}",
            f"--dhcp-hostsdir={self.hosts_dir}",
            f"--dhcp-leasefile={self.lease_file}",
            "--dhcp-authoritative",
            f"--pid-file={self.pid_file}",
            f"--log-facility={self.log_file}",
            "--log-dhcp",
        ]
        if self._dns:
            args.append(f"--dhcp-option=option:dns-server,{','.join(self._dns)}")
        if self._no_ping:
            args.append("--no-ping")
        if self._user is not None or self.runs_as != DEFAULT_USER:
            args.append(f"--user={self.runs_as}")
        return args

    def make_readable(self) -> str:
        """Make the hosts dir reachable by the user dnsmasq runs as; returns that user (module docstring)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.hosts_dir.mkdir(mode=0o755, exist_ok=True)
        for d in (self.state_dir, self.hosts_dir):
            d.chmod(0o755)
        try:
            who = pwd.getpwnam(self.runs_as)
        except KeyError:
            return self.runs_as  # dnsmasq itself refuses an unknown user, with a message
        parent = self.state_dir.parent
        st = parent.stat()
        if st.st_uid == os.geteuid() and not _searchable(st, who) and not st.st_mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        blocked = next((d for d in (self.hosts_dir, *self.hosts_dir.parents) if not _searchable(d.stat(), who)), None)
        if blocked is not None:
            self.runs_as = pwd.getpwuid(self.hosts_dir.stat().st_uid).pw_name
        return self.runs_as

    def pid(self) -> int | None:
        """The pid of this dnsmasq if it is alive, else None (a stale pid file is ignored)."""
        found = self._process()
        return found[0] if found else None

    def interface(self) -> str | None:
        """The bridge the running dnsmasq serves (from its own command line)."""
        found = self._process()
        if found is None:
            return None
        for arg in found[1]:
            if arg.startswith("--interface="):
                return addresses.ifname(arg.removeprefix("--interface="))
        return None

    def _process(self) -> tuple[int, list[str]] | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        proc = Path(f"/proc/{pid}")
        try:
            stat = (proc / "stat").read_text()
            cmdline = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            return None
        # A zombie is dead; a recycled pid is somebody else's process.
        state = stat.rsplit(")", 1)[1].split()[0]
        if state == "Z" or f"--pid-file={self.pid_file}" not in cmdline:
            return None
        return pid, cmdline

    def running(self) -> bool:
        return self.pid() is not None

    def start(self, network: Network) -> bool:
        if self.running():
            return False
        self.make_readable()
        self.lease_file.touch(exist_ok=True)
        # dnsmasq forks, and its first process exits once the daemon started
        # (or failed to bind), so the exit status is meaningful.
        try:
            netns.run(self._netns, self.argv(network), code=host_codes.DHCP_START_FAILED)
        except netns.CommandError as e:
            raise DhcpError(e.message, code=host_codes.DHCP_START_FAILED) from e
        for _ in range(50):
            if self.running():
                return True
            time.sleep(0.1)
        raise DhcpError(
            f"dnsmasq for {network.bridge} did not write {self.pid_file}",
            code=host_codes.DHCP_START_FAILED,
        )

    def stop(self, timeout_s: float = 5.0) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.pid() is not None:
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        return True

    def release(self, mac: str, ip: str) -> bool:
        """Drop the lease of `mac` on `ip`, as if the client had sent DHCPRELEASE.

        A lease outlives its reservation in the lease file; left there, it would
        satisfy the next readiness check of that slot before the new guest asked
        for anything, and block the IP for another MAC until it expires.
        False when there was no such lease or no server to tell.
        """
        lease = next((x for x in read_leases(self.lease_file) if x.mac == mac and x.ip == ip), None)
        bridge = self.interface()
        if lease is None or bridge is None:
            return False
        # dhcp_release reads its operands by position and knows no "--"; each one
        # comes from the lease file, so each is checked before it reaches the argv.
        try:
            netns.run(
                self._netns,
                [
                    self._release_binary,
                    addresses.ifname(bridge),
                    tools.operand(lease.ip),
                    addresses.mac(lease.mac),
                    *([] if lease.client_id is None else [tools.operand(lease.client_id)]),
                ],
                code=host_codes.DHCP_RELEASE_FAILED,
            )
        except netns.CommandError as e:
            raise DhcpError(e.message, code=host_codes.DHCP_RELEASE_FAILED) from e
        # dnsmasq handles the packet asynchronously; wait for the file to show it.
        for _ in range(50):
            if not any(x.mac == mac and x.ip == ip for x in read_leases(self.lease_file)):
                return True
            time.sleep(0.05)
        raise DhcpError(
            f"dnsmasq kept the lease of {mac} on {ip} after DHCPRELEASE",
            code=host_codes.DHCP_RELEASE_FAILED,
        )

    def reload(self) -> bool:
        """SIGHUP: re-read the hosts dir, dropping removed or changed records.

        False when the server is not running (it reads the dir when it starts).
        """
        pid = self.pid()
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError as e:
            raise DhcpServerDown("dnsmasq exited while being reloaded") from e
        return True


def _searchable(st: os.stat_result, who: pwd.struct_passwd) -> bool:
    """May `who` pass through a directory with this stat (root may pass anything)."""
    if who.pw_uid == 0:
        return True
    if st.st_uid == who.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == who.pw_gid or st.st_gid in os.getgrouplist(who.pw_name, who.pw_gid):
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


class DnsmasqDhcp:
    """DhcpDriver over a DnsmasqServer's hosts dir and lease file."""

    def __init__(self, server: DnsmasqServer) -> None:
        self.server = server

    def ensure_running(self, network: Network) -> bool:
        return self.server.start(network)

    def ensure_reservation(self, reservation: Reservation) -> bool:
        path = self._path(reservation.name)
        old: Reservation | None = None
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text == reservation.line():
                return False
            old = parse_reservation(text)
        except FileNotFoundError:
            pass
        self.server.hosts_dir.mkdir(parents=True, mode=0o755, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(reservation.line(), encoding="utf-8")
        tmp.chmod(0o644)
        tmp.replace(path)
        self.server.reload()
        if old is not None and (old.mac, old.ip) != (reservation.mac, reservation.ip):
            # The old pair is void: its lease would hold the IP or fake readiness.
            self.server.release(old.mac, old.ip)
        return True

    def remove_reservation(self, name: str) -> bool:
        path = self._path(name)
        try:
            old = parse_reservation(path.read_text(encoding="utf-8", errors="replace"))
            path.unlink()
        except FileNotFoundError:
            return False
        self.server.reload()
        if old is not None:
            self.server.release(old.mac, old.ip)
        return True

    def reservations(self) -> tuple[Reservation, ...]:
        found: list[Reservation] = []
        for path in self._files():
            parsed = parse_reservation(path.read_text(encoding="utf-8", errors="replace"))
            if parsed is not None:
                found.append(parsed)
        return tuple(found)

    def prune_reservations(self, keep: Collection[str]) -> tuple[str, ...]:
        removed: list[str] = []
        released: list[Reservation] = []
        for path in self._files():
            if path.name not in keep:
                old = parse_reservation(path.read_text(encoding="utf-8", errors="replace"))
                path.unlink(missing_ok=True)
                removed.append(path.name)
                if old is not None:
                    released.append(old)
        if removed:
            self.server.reload()
        for old in released:
            self.server.release(old.mac, old.ip)
        return tuple(removed)

    def leases(self) -> tuple[Lease, ...]:
        return read_leases(self.server.lease_file)

    def _path(self, name: str) -> Path:
        return self.server.hosts_dir / addresses.hostname(name)

    def _files(self) -> list[Path]:
        if not self.server.hosts_dir.is_dir():
            return []
        # Dotfiles are our own half-written temp files; dnsmasq skips them too.
        return sorted(p for p in self.server.hosts_dir.iterdir() if p.is_file() and not p.name.startswith("."))
