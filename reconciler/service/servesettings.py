"""The settings of `gpuaas serve`: the listen address, the bearer token file, limits and the optional parts."""

from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from reconciler import codes as reconciler_codes
from reconciler.service import asgi
from schemas import inputfiles
from schemas.errors import PermanentError, UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


class ServeError(PermanentError):
    code = reconciler_codes.SERVE_ERROR


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT`, `:PORT` (loopback) or `PORT`."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(
            f"--listen takes HOST:PORT, not {text!r}", code=reconciler_codes.SERVE_LISTEN_INVALID
        ) from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--listen port must be 0..65535, not {port}", code=reconciler_codes.SERVE_LISTEN_INVALID)
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def load_token(path: Path) -> str:
    """The bearer token in `path`; refused when group or others may read it, or when it is empty."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ServeError(f"token file {path} is not a regular file", code=reconciler_codes.SERVE_TOKEN_FILE_INVALID)
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise ServeError(
                f"token file {path} is accessible by group or others (mode {mode:04o}); chmod 600 {path}",
                code=reconciler_codes.SERVE_TOKEN_FILE_PERMISSIONS,
            )
        # Bounded, regular file only, never quoted: a file named by mistake (a key, /dev/zero) is refused unread.
        try:
            token = inputfiles.read_text(
                path, limit=4 * inputfiles.KIB, code=reconciler_codes.SERVE_TOKEN_FILE_INVALID, what="token file"
            ).strip()
        except PermanentError as e:
            raise ServeError(e.message, code=e.code) from e
    except OSError as e:
        raise ServeError(
            f"cannot read token file {path}: {e.strerror or e}", code=reconciler_codes.SERVE_TOKEN_FILE_UNREADABLE
        ) from e
    if not token or any(c.isspace() for c in token):
        raise ServeError(
            f"token file {path} must hold one token (no spaces), and not be empty",
            code=reconciler_codes.SERVE_TOKEN_FILE_INVALID,
        )
    return token


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    max_reconcile_age_s: float = 0.0  # 0: not checked (an idle loop records no reconciliation)
    failing_grace_s: float = 300.0
    head_grace_s: float = 300.0  # /readyz: HEAD not applied this long (invalid, behind, failing) is not ready
    refresh_s: int = 15
    capacity_refresh_s: float = 10.0
    capacity_wait_s: float = 2.0
    policy: str | None = None
    pool_size: int = 8
    allowed_hosts: tuple[str, ...] = ()  # besides loopback names and the listen address; "*": any
    max_connections: int = 16384
    request_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    agent_pool_size: int = 6
    tenant_tokens: Path | None = None  # TENANT:SHA256 lines (tenants.py); re-read when the file changes
    intake_repo: Path | None = None  # the desired-state checkout POST /api/v1/allocations commits to
    intake_push: tuple[str, str] | None = None  # (remote, branch) the intake pushes to
    webhook_url: str | None = None  # every allocation event POSTed here, signed (webhooks.py)
    webhook_secret: Path | None = None
    webhook_backoff_s: float = 1.0
    console_credentials: Path | None = None  # None: no console gateway (the route answers 404)
    console_libvirt_uri: str = "qemu+ssh://gpuaas@{node}/system"

    def hosts(self) -> tuple[str, ...]:
        """The Host names answered: loopback names, the listen address (unless a wildcard), --allow-host."""
        own = () if self.host in ("0.0.0.0", "::", "") else (self.host,)  # noqa: S104 - comparing, not binding
        return (*asgi.LOOPBACK_NAMES, *own, *self.allowed_hosts)

    def check(self) -> None:
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ServeError(
                "--webhook needs --webhook-secret-file (payloads are signed)",
                code=reconciler_codes.SERVE_WEBHOOK_SECRET_MISSING,
            )
        if not is_loopback(self.host) and self.token is None:
            raise ServeError(
                f"listening on {self.host} (not loopback) needs --token-file: every request but "
                "/healthz must then carry that bearer token",
                code=reconciler_codes.SERVE_LISTEN_NEEDS_TOKEN,
            )


def token_from(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else load_token(Path(path))
