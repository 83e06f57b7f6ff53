"""The cloud-init NoCloud seed of a slice VM: user-data, meta-data, network-config.

Rendered as JSON (YAML 1.2 is a superset of JSON; cloud-init reads it), so no
value from a plan can break out of its field. Written as UTF-8 text, never
with backslash-u escapes: a character outside the Basic Multilingual Plane (an emoji
in an SSH key comment) would be escaped as a surrogate pair, and cloud-init's
YAML loader reads each half as a lone surrogate, not the character. SSH keys are checked against
the same pattern desired-state validation uses. The seed ISO (volume id
`cidata`) is packed by genisoimage (`drivers/seediso.py`) from files this module wrote.

With a `GuestAnnounce` from the readiness gate, the seed also installs the
guest side of seed 002's marker (`host_reconciler.drivers.guestmarker`): a
constant script, run by a systemd unit, that waits for
`/var/lib/gpuaas/slice-ready` and posts the VM's name and token to the host
agent. The URL and the body are data files beside it, read with `cat`, so
no value becomes shell text.
"""

from __future__ import annotations

import json
import re

from desired.patterns import SSH_KEY_RE
from host_reconciler import codes as host_codes
from host_reconciler import domains
from host_reconciler.drivers.protocols import GUEST_MARKER, GuestAnnounce
from schemas.errors import PermanentError
from schemas.hostplans import VmSpec

_SSH_KEY = re.compile(SSH_KEY_RE)  # the rule validation applied, checked again on the plan's copy
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ISO_NAME = "seed.iso"


class SeedError(PermanentError):
    code = host_codes.SEED_INVALID


ANNOUNCER = "/usr/local/sbin/gpuaas-slice-ready"
ANNOUNCE_URL = "/etc/gpuaas/slice-ready.url"
ANNOUNCE_BODY = "/etc/gpuaas/slice-ready.body"
DEVICES_URL = "/etc/gpuaas/slice-devices.url"
DEVICES_HEAD = "/etc/gpuaas/slice-devices.head"
DEVICES_REPORT = "/tmp/gpuaas-slice-devices"  # noqa: S108 -- the guest's own scratch file, rewritten each round
TELEMETRY_URL = "/etc/gpuaas/slice-telemetry.url"
TELEMETRY_HEAD = "/etc/gpuaas/slice-telemetry.head"
TELEMETRY_REPORT = "/tmp/gpuaas-slice-telemetry"  # noqa: S108 -- as above
TELEMETRY_QUERY = (
    "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"
)
UNIT = "gpuaas-slice-ready.service"

# Posts once the marker exists, then again every minute (a restarted host agent hears it again).
# curl where the image has it, else wget (busybox's too): both send the body as a form. No wget -T:
# Debian's busybox wget is built without it (and crashes on it); the listener drops a stalled post.
ANNOUNCER_SCRIPT = f"""#!/bin/sh
# gpuaas: tell the host agent that {GUEST_MARKER} exists (seed 002 readiness),
# and what devices this guest sees (GPUs from nvidia-smi -L, amd-smi or rocm-smi; RDMA port states).
marker={GUEST_MARKER}
post() {{  # post FILE to URL
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -m 5 --data-binary "@$2" "$1" >/dev/null 2>&1
  else
    wget -q -O /dev/null --post-file "$2" "$1" >/dev/null 2>&1
  fi
}}
report() {{
  cat {DEVICES_HEAD}
  if command -v nvidia-smi >/dev/null 2>&1; then tool=nvidia-smi; out="$(nvidia-smi -L 2>&1)"
  elif command -v amd-smi >/dev/null 2>&1; then tool=amd-smi; out="$(amd-smi list 2>&1)"
  elif command -v rocm-smi >/dev/null 2>&1; then tool=rocm-smi; out="$(rocm-smi --showuniqueid 2>&1)"
  else tool=none; out=""; fi
  echo "tool $tool"
  for s in /sys/class/infiniband/*/ports/*/state; do
    [ -e "$s" ] || continue
    d="${{s#/sys/class/infiniband/}}"; p="${{s%/state}}"
    echo "fabric ${{d%%/*}}.${{p##*/}} $(cat "$s")"
  done
  echo smi-begin
  printf '%s\\n' "$out" | head -c 12000
  echo smi-end
}}
telemetry() {{  # GPU telemetry (seed 002 section 8): nvidia-smi only; without it the host reports "unavailable"
  [ -s {TELEMETRY_URL} ] && command -v nvidia-smi >/dev/null 2>&1 || return 0
  {{ cat {TELEMETRY_HEAD}
     nvidia-smi --query-gpu={TELEMETRY_QUERY} --format=csv,noheader,nounits 2>/dev/null | head -n 16 | sed 's/^/gpu /'
  }} > {TELEMETRY_REPORT}
  post "$(cat {TELEMETRY_URL})" {TELEMETRY_REPORT}
}}
while :; do
  while [ ! -e "$marker" ]; do sleep 1; done
  ok=1
  post "$(cat {ANNOUNCE_URL})" {ANNOUNCE_BODY} || ok=0
  if [ "$ok" = 1 ] && [ -s {DEVICES_URL} ]; then
    report > {DEVICES_REPORT} 2>/dev/null
    post "$(cat {DEVICES_URL})" {DEVICES_REPORT} || ok=0
  fi
  if [ "$ok" = 1 ]; then telemetry; sleep 30; telemetry; sleep 30; else sleep 2; fi
done
"""

UNIT_TEXT = f"""[Unit]
Description=gpuaas: announce {GUEST_MARKER} to the host agent
Wants=network-online.target
After=network-online.target

[Service]
ExecStart={ANNOUNCER}
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""


def render(vm: VmSpec, *, announce: GuestAnnounce | None = None) -> dict[str, bytes]:
    """The seed files of `vm` (pure); with `announce`, the guest announces its readiness marker."""
    for key in vm.ssh_keys:
        if not _SSH_KEY.match(key):
            raise SeedError(
                f"{vm.allocation_id}: an SSH key is not an OpenSSH public key",
                code=host_codes.SEED_SSH_KEY,
            )
    user = vm.image.default_username if vm.image else "ubuntu"
    if not _USER.match(user):
        raise SeedError(f"{vm.allocation_id}: unusable default user {user!r}", code=host_codes.SEED_USER)
    boot = min(vm.bundles, key=lambda b: b.slot_index)
    user_data = {
        "hostname": vm.name,
        "users": [
            {
                "name": user,
                "shell": "/bin/bash",
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "lock_passwd": True,
                "ssh_authorized_keys": list(vm.ssh_keys),
            }
        ],
        "ssh_pwauth": False,
        "disable_root": True,
    }
    if announce is not None:
        user_data["write_files"] = [
            {"path": ANNOUNCER, "permissions": "0755", "owner": "root:root", "content": ANNOUNCER_SCRIPT},
            {"path": ANNOUNCE_URL, "permissions": "0600", "owner": "root:root", "content": announce.url},
            {"path": ANNOUNCE_BODY, "permissions": "0600", "owner": "root:root", "content": announce.body},
            *(
                [
                    {"path": DEVICES_URL, "permissions": "0600", "owner": "root:root", "content": announce.devices_url},
                    {
                        "path": DEVICES_HEAD,
                        "permissions": "0600",
                        "owner": "root:root",
                        "content": announce.devices_head,
                    },
                ]
                if announce.devices_url
                else []
            ),
            *(
                [
                    {
                        "path": TELEMETRY_URL,
                        "permissions": "0600",
                        "owner": "root:root",
                        "content": announce.telemetry_url,
                    },
                    {
                        "path": TELEMETRY_HEAD,
                        "permissions": "0600",
                        "owner": "root:root",
                        "content": announce.telemetry_head,
                    },
                ]
                if announce.telemetry_url
                else []
            ),
            {"path": f"/etc/systemd/system/{UNIT}", "permissions": "0644", "owner": "root:root", "content": UNIT_TEXT},
        ]
        user_data["runcmd"] = [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "--no-block", UNIT]]
    meta = {"instance-id": vm.uuid, "local-hostname": vm.name}
    network = {
        "version": 2,
        "ethernets": {
            "mgmt0": {
                "match": {"macaddress": boot.mac_address.lower()},
                "set-name": "mgmt0",
                "dhcp4": True,
            }
        },
    }
    return {
        "user-data": ("#cloud-config\n" + _text(user_data)).encode("utf-8"),
        "meta-data": _text(meta).encode("utf-8"),
        "network-config": _text(network).encode("utf-8"),
        "spec-digest": domains.seed_digest(vm).encode(),
    }


def _text(doc: object) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
