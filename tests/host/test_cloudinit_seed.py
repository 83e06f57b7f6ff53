"""Seeds the guest can read: UTF-8 text that cloud-init loads back identically (issue 15).

An SSH key comment with a character outside the Basic Multilingual Plane
(an emoji) used to be written as a JSON surrogate pair (`\\ud83d\\ude00`),
which a YAML loader reads as two lone surrogates. cloud-init's loader is
`cloudinit.util.load_yaml` (yaml.safe_load on the decoded bytes); the test
uses it when cloud-init is installed (Debian's python3, or a tree named by
$GPUAAS_CLOUDINIT_PATH, run by $GPUAAS_CLOUDINIT_PYTHON if set), and
yaml.safe_load, what it calls, always.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from host_reconciler import cloudinit
from schemas import hostplans as hp

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa dev 😀 ünïcode@laptop"


def vm() -> hp.VmSpec:
    b = hp.SlotBundle(
        0, "0000:1b:00.0", "0000:1a:00.1", "/dev/disk/by-id/nvme-S0", "52:54:00:00:00:01", "10.100.0.10", 0
    )
    return hp.VmSpec("alloc-emoji", "acme", (b,), vcpu_count=2, memory_mib=1024, ssh_keys=(KEY,))


def keys_of(user_data: object) -> list[str]:
    assert isinstance(user_data, dict)
    return list(user_data["users"][0]["ssh_authorized_keys"])


def test_user_data_is_utf8_text_without_surrogate_escapes() -> None:
    files = cloudinit.render(vm())
    raw = files["user-data"]
    text = raw.decode("utf-8")  # strict: valid UTF-8
    assert text.startswith("#cloud-config\n")
    assert "😀" in text and "\\ud83d" not in text and "\\u" not in text
    assert keys_of(yaml.safe_load(raw)) == [KEY]
    assert keys_of(json.loads(text.split("\n", 1)[1])) == [KEY]  # still plain JSON below the header
    for name in ("meta-data", "network-config"):
        yaml.safe_load(files[name].decode("utf-8"))


def _cloudinit_python() -> tuple[list[str], dict[str, str]] | None:
    """A Python that imports cloud-init ($GPUAAS_CLOUDINIT_PYTHON, ours, Debian's), with $GPUAAS_CLOUDINIT_PATH."""
    env = dict(os.environ)
    extra = os.environ.get("GPUAAS_CLOUDINIT_PATH")
    if extra:
        env["PYTHONPATH"] = extra
    for python in (os.environ.get("GPUAAS_CLOUDINIT_PYTHON"), sys.executable, shutil.which("python3", path="/usr/bin")):
        if python is None:
            continue
        probe = subprocess.run([python, "-c", "import cloudinit.util"], env=env, capture_output=True, check=False)
        if probe.returncode == 0:
            return [python], env
    return None


def test_cloud_inits_own_loader_reads_the_key_back_identically(tmp_path: Path) -> None:
    found = _cloudinit_python()
    if found is None:
        pytest.skip(
            "cloud-init is not installed (apt-get download cloud-init; dpkg-deb -x; "
            "GPUAAS_CLOUDINIT_PATH=<tree>/usr/lib/python3/dist-packages)"
        )
    argv, env = found
    seed = tmp_path / "user-data"
    seed.write_bytes(cloudinit.render(vm())["user-data"])
    out = subprocess.run(
        [
            *argv,
            "-c",
            "import json, sys; from cloudinit import util; "
            "doc = util.load_yaml(open(sys.argv[1], 'rb').read()); "
            "sys.stdout.buffer.write(json.dumps(doc['users'][0]['ssh_authorized_keys'],"
            " ensure_ascii=False).encode('utf-8'))",
            str(seed),
        ],
        env=env,
        capture_output=True,
        check=True,
    )
    assert json.loads(out.stdout.decode("utf-8")) == [KEY]
