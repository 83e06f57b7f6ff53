"""Build the machine providers a desired state declares, reading their credentials at run time.

Credentials are named in git (`credentials: {env: NAME}` or `{file: /path}`)
and read here, never stored, printed or logged; a missing one is a
`baremetal.provider.credentials` error naming the reference, not the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from desired import models as m
from desired.state import DesiredState
from reconciler.providers.ironic import IronicProvider
from reconciler.providers.maas import MaasProvider
from reconciler.providers.protocols import CREDENTIALS, MachineProvider
from schemas.errors import PermanentError


def secret(ref: m.CredentialRef) -> str:
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value:
            raise PermanentError(f"environment variable {ref.env} is not set", code=CREDENTIALS)
        return value
    if ref.file is None:  # the model requires exactly one of env and file
        raise PermanentError("credentials name neither env nor file", code=CREDENTIALS)
    try:
        return Path(ref.file).read_text().strip()
    except OSError as e:
        raise PermanentError(f"cannot read credentials file {ref.file}: {e.strerror}", code=CREDENTIALS) from None


def build(spec: m.MachineProviderSpec) -> MachineProvider:
    key = secret(spec.credentials) if spec.credentials is not None else None
    if spec.kind == "maas":
        if key is None:
            raise PermanentError(f"MAAS provider {spec.name} needs credentials (an API key)", code=CREDENTIALS)
        return MaasProvider(spec.name, spec.url, api_key=key, timeout=spec.timeout_s)
    return IronicProvider(spec.name, spec.url, token=key, timeout=spec.timeout_s, image_base_url=spec.image_base_url)


class Providers:
    """The declared providers, built lazily: one with unreadable credentials fails only its own leases."""

    def __init__(
        self, specs: tuple[m.MachineProviderSpec, ...] = (), built: Mapping[str, MachineProvider] | None = None
    ) -> None:
        self._specs = {s.name: s for s in specs}
        self._built: dict[str, MachineProvider] = dict(built or {})

    @classmethod
    def of(cls, state: DesiredState) -> Providers:
        return cls(state.fleet.machine_providers if state.fleet else ())

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._specs) | set(self._built)))

    def get(self, name: str) -> MachineProvider | None:
        """The provider; None when it is not declared. Raises PermanentError for missing credentials."""
        if name not in self._built:
            spec = self._specs.get(name)
            if spec is None:
                return None
            self._built[name] = build(spec)
        return self._built[name]
