"""Who may open which console: credentials of tenants and operators, hashed at rest.

The credentials file (`--console-credentials FILE`, mode 0600 like the
token file) is JSON:

    {"credentials": [
      {"principal": "alice", "role": "tenant", "tenant": "acme-research", "token_sha256": "<64 hex>"},
      {"principal": "oncall", "role": "operator", "token_sha256": "<64 hex>"}
    ]}

Only the sha256 of each bearer token is stored; a presented token is hashed
and looked up, so the file leaks no usable secret. A tenant's credential opens
the consoles of its own tenant's allocations only; an operator's opens any.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler import codes as reconciler_codes
from schemas.errors import PermanentError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class CredentialsError(PermanentError):
    code = reconciler_codes.SERVE_CONSOLE_CREDENTIALS_INVALID


class Role(enum.StrEnum):
    TENANT = "tenant"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role
    tenant: str | None = None

    def may_open(self, allocation_tenant: str) -> bool:
        return self.role is Role.OPERATOR or self.tenant == allocation_tenant


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Credentials:
    """token sha256 -> principal."""

    def __init__(self, by_hash: Mapping[str, Principal]) -> None:
        self._by_hash = dict(by_hash)

    def __len__(self) -> int:
        return len(self._by_hash)

    def lookup(self, token: str | None) -> Principal | None:
        if not token:
            return None
        return self._by_hash.get(token_sha256(token))

    @classmethod
    def parse(cls, doc: Any, where: str = "console credentials") -> Credentials:
        entries = doc.get("credentials") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise CredentialsError(f'{where}: needs {{"credentials": [...]}}')
        out: dict[str, Principal] = {}
        for i, e in enumerate(entries):
            at = f"{where}: credentials[{i}]"
            if not isinstance(e, dict) or set(e) - {"principal", "role", "tenant", "token_sha256"}:
                raise CredentialsError(f"{at}: an object of principal, role, tenant, token_sha256")
            name, role, tenant, digest = e.get("principal"), e.get("role"), e.get("tenant"), e.get("token_sha256")
            if not isinstance(name, str) or not name:
                raise CredentialsError(f"{at}.principal: a non-empty string")
            if role not in (Role.TENANT.value, Role.OPERATOR.value):
                raise CredentialsError(f"{at}.role: tenant or operator, not {role!r}")
            if (role == Role.TENANT.value) != isinstance(tenant, str) or (tenant is not None and not tenant):
                raise CredentialsError(f"{at}.tenant: required for a tenant (its own allocations), absent otherwise")
            if not isinstance(digest, str) or not _HEX64.match(digest):
                raise CredentialsError(f"{at}.token_sha256: 64 lowercase hex characters (sha256 of the token)")
            if digest in out:
                raise CredentialsError(f"{at}.token_sha256: the same token as {out[digest].name}")
            out[digest] = Principal(name, Role(role), tenant)
        return cls(out)

    @classmethod
    def load(cls, path: Path) -> Credentials:
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise CredentialsError(f"{path} is not a regular file")
            if st.st_mode & 0o077:
                raise CredentialsError(
                    f"{path} is accessible by group or others (mode {st.st_mode & 0o777:04o}); chmod 600 {path}",
                    code=reconciler_codes.SERVE_CONSOLE_CREDENTIALS_PERMISSIONS,
                )
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise CredentialsError(f"cannot read {path}: {e.strerror or e}") from e
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CredentialsError(f"{path} is not JSON: {e}") from e
        return cls.parse(doc, str(path))
