"""The project's own exceptions, each with a stable dotted code.

Library errors (psycopg, libvirt, gitpython) are wrapped with `raise ... from e`
so callers and users never see a foreign exception type. Whether an error is
worth retrying lives in the type: loops retry TemporaryError and stop on
PermanentError, in one place.
"""

from __future__ import annotations

from schemas import codes as schemas_codes


class GpuaasError(Exception):
    """An error a user can see: printed as `CODE: message`, never a traceback."""

    code = schemas_codes.GPUAAS_ERROR

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class PermanentError(GpuaasError):
    """Retrying will not help until something (usually desired state) changes."""


class TemporaryError(GpuaasError):
    """Worth retrying after `delay` seconds (a lost race, a server restarting)."""

    def __init__(self, message: str, *, code: str | None = None, delay: float = 1.0) -> None:
        super().__init__(message, code=code)
        self.delay = delay


class UsageError(PermanentError):
    code = schemas_codes.CLI_USAGE
