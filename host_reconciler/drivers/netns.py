"""Run network operations in a named network namespace, or in the host's own.

Production drivers act on the host namespace (`netns=None`). Tests give every
driver a throwaway namespace made with `ip netns add`, so the same code that
runs on a node runs in the test, and nothing leaks into the machine running it.

Netlink sockets and TCP probes are opened after a per-thread `setns(2)` and the
thread is moved straight back: a socket stays bound to the namespace it was
created in. This avoids pyroute2's forked helper process for namespaces.
Commands (iptables, sysctl, dnsmasq) get the `ip netns exec NAME` prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

from pyroute2 import IPRoute

from host_reconciler import codes as host_codes
from schemas.errors import PermanentError

_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(PermanentError):
    code = host_codes.NETNS_ERROR


class CommandError(PermanentError):
    """A system tool (iptables, sysctl, dnsmasq) exited non-zero."""

    code = host_codes.COMMAND_FAILED


def checked(netns: str | None) -> str | None:
    if netns is not None and (not _NAME.match(netns) or netns in {".", ".."}):
        raise NamespaceError(f"not a namespace name: {netns!r}", code=host_codes.NETNS_INVALID_NAME)
    return netns


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NamespaceError(f"setns failed: {os.strerror(err)}", code=host_codes.NETNS_SETNS_FAILED)


@contextlib.contextmanager
def entered(netns: str | None) -> Iterator[None]:
    """Move this thread into `netns` for the block (no-op for the host namespace)."""
    if checked(netns) is None:
        yield
        return
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NamespaceError(f"network namespace {netns} does not exist", code=host_codes.NETNS_MISSING) from e
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


@contextlib.contextmanager
def iproute(netns: str | None) -> Iterator[Any]:
    """An IPRoute (netlink route socket) bound to `netns`, closed after the block."""
    with entered(netns):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def connect(netns: str | None, address: tuple[str, int], timeout: float) -> None:
    """Open and close a TCP connection to `address` from inside `netns`.

    Raises OSError when nothing accepts the connection within `timeout` seconds.
    """
    with entered(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        sock.connect(address)


def argv(netns: str | None, command: Sequence[str]) -> list[str]:
    if checked(netns) is None:
        return list(command)
    return ["ip", "netns", "exec", str(netns), *command]


def run(
    netns: str | None, command: Sequence[str], *, code: str, ok: Sequence[int] = (0,)
) -> subprocess.CompletedProcess[str]:
    """Run `command` (an argv list, never a shell line); CommandError with `code` unless
    it exits with one of the `ok` statuses."""
    full = argv(netns, command)
    try:
        done = subprocess.run(full, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CommandError(f"{command[0]}: {e}", code=code) from e
    if done.returncode not in ok:
        raise CommandError(f"{' '.join(full)} exited {done.returncode}: {done.stderr.strip()}", code=code)
    return done
