"""Pack a VM's cloud-init seed files into its NoCloud ISO with genisoimage.

Apart from `host_reconciler.cloudinit` (which renders the files and runs no
tool) so the engine reaches genisoimage only through `context.Drivers`.
"""

from __future__ import annotations

from pathlib import Path

from host_reconciler import codes as host_codes
from host_reconciler.cloudinit import ISO_NAME, SeedError
from host_reconciler.drivers import tools


def pack_iso(seed_dir: Path) -> None:
    """Pack the seed files of `seed_dir` into seed.iso (NoCloud, volume id cidata)."""
    files = [str(seed_dir / n) for n in ("user-data", "meta-data", "network-config")]
    res = tools.run(
        [
            "genisoimage",
            "-quiet",
            "-output",
            tools.operand(seed_dir / ISO_NAME),
            "-volid",
            "cidata",
            "-joliet",
            "-rock",
            "--",
            *files,
        ],
        timeout=60,
    )
    if res.returncode != 0:
        raise SeedError(f"genisoimage failed: {res.stderr.strip()}", code=host_codes.SEED_ISO)
