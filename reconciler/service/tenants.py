"""Who is asking: the operator (the `--token-file` token; anyone on an open loopback server) or one tenant.

Tenant tokens live in a file given by `serve --tenant-tokens FILE`, one
`TENANT:SHA256` line per token (the hex sha256 of the token; `#` comments
and blank lines skipped), so the file holds no secret and a tenant may have
several tokens while one is rotated. `gpuaas tenant token issue TENANT
--file FILE` makes a token, appends its line and prints the token once.

A tenant principal sees and changes only its own allocations and events;
another tenant's allocation answers 404 exactly as an absent one does, so a
tenant cannot learn which ids exist. Operator-only pages (nodes, drift,
history, metrics, the dashboard) answer 403 `api.forbidden` to a tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from reconciler import codes as reconciler_codes
from schemas.errors import PermanentError

OPERATOR = "operator"
_LINE = re.compile(r"^([a-z0-9][a-z0-9-]{0,62}):([0-9a-f]{64})$")


class TenantTokensInvalid(PermanentError):
    code = reconciler_codes.SERVE_TENANT_TOKENS_INVALID


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: `tenant` None is the operator (sees everything)."""

    tenant: str | None

    @property
    def name(self) -> str:
        return OPERATOR if self.tenant is None else f"tenant:{self.tenant}"

    def may_see(self, tenant: str | None) -> bool:
        return self.tenant is None or self.tenant == tenant


OPERATOR_PRINCIPAL = Principal(None)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "gpt_" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class TenantTokens:
    by_digest: dict[str, str]  # sha256 hex -> tenant

    def tenant_of(self, token: str) -> str | None:
        want = digest(token)
        found = None
        for known, tenant in self.by_digest.items():  # constant time per entry: no early exit on a near match
            if hmac.compare_digest(known, want):
                found = tenant
        return found


def load(path: Path) -> TenantTokens:
    """The tenant token file; a writable-by-others file or a malformed line is refused, naming the line."""
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TenantTokensInvalid(f"cannot read tenant token file {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise TenantTokensInvalid(f"tenant token file {path} is not UTF-8 text") from e
    if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022:
        raise TenantTokensInvalid(
            f"tenant token file {path} is not a regular file writable only by its owner "
            f"(mode {stat.S_IMODE(st.st_mode):04o}): anyone who can write it can add a tenant"
        )
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise TenantTokensInvalid(f"{path}:{number}: not TENANT:SHA256 (a tenant name, a colon, 64 hex digits)")
        found[m.group(2)] = m.group(1)
    return TenantTokens(found)


def issue(path: Path, tenant: str) -> str:
    """A new token for `tenant`: its digest line appended to `path` (made 0600 when new); the token returned."""
    import os

    if not _LINE.match(f"{tenant}:{'0' * 64}"):
        raise PermanentError(
            f"tenant {tenant!r} is not 1-63 lowercase letters, digits or '-'", code=reconciler_codes.TENANT_NAME_INVALID
        )
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(f"{tenant}:{digest(token)}\n")
    return token


def revoke(path: Path, tenant: str) -> int:
    """Drop every token of `tenant` from `path` (atomic rewrite); how many were dropped."""
    import os

    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [ln for ln in lines if not ln.strip().startswith(f"{tenant}:")]
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("".join(ln + "\n" for ln in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)
