"""Text forms of a candidate: YAML for the pull request, JSON for machines.

YAML is the SlotMap document itself, preceded by a comment block that opens
with the blocker summary (`7 slots ready, 1 blocked: disk.mounted (slot 3)`)
and then gives the evidence a reviewer needs (prerequisites, OS disk, NUMA,
and per slot the GPU driver and IOMMU group, the VF's parent port state, link
layer and GUID, the disk's size and state). A second document follows: the
proposed Node (`proposals.node_document`), its placeholders marked. Comments
survive into the pull request and are ignored by the loader; the loader reads
both documents from one file. JSON carries the candidate, the proposed Node,
the summary and the full discovery.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from desired import models as m
from desired import patterns
from host_reconciler.discovery import candidates, facts, hosts, proposals

_QUOTED = re.compile(f"{patterns.PCI_RE}|{patterns.MAC_RE}")


class _Dumper(yaml.SafeDumper):
    """Indented block sequences, as the example fleet writes them."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = '"' if _QUOTED.match(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def slot_map_document(slot_map: m.SlotMap) -> dict[str, Any]:
    doc = slot_map.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    for slot in doc["slots"]:
        slot.setdefault("blockers", [])  # an explicit empty list: checked, nothing found
    return doc


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB"


def _tb(n: int) -> str:
    return f"{n / 1e12:.2f} TB"


def _header(candidate: candidates.Candidate, discovery: facts.Discovery) -> list[str]:
    lines = [
        f"Candidate SlotMap for node {candidate.node} from `gpuaas host discover` (kernel {discovery.kernel or '?'}).",
        proposals.summary(candidate).line() + ".",
        "Discovery proposes; git approves. Review every slot, resolve or drop slots with blockers,",
        "delete `approval_required: true`, and merge through a pull request.",
        "",
        "prerequisites:",
    ]
    for req in discovery.prerequisites:
        mark = "ok" if req.ok else "FAIL" if req.required else "info"
        lines.append(f"  {mark:<5} {req.name:<10} {req.detail}")
    os_disks = ", ".join(f"{d.name} {d.by_id or '(no by-id link)'}" for d in discovery.os_disks)
    lines.append(f"os disk: {os_disks or 'not found (root is not on a local block device)'}")
    for n in discovery.numa_nodes:
        mem = f", {_gib(n.memory_kib * 1024)}" if n.memory_kib else ""
        pages = "".join(
            f", hugepages {hosts.page_size(h.size_kib)} {h.free}/{h.total} free" for h in n.hugepages if h.total
        )
        lines.append(f"numa{n.node}: {len(n.cpus)} cpus ({n.cpulist}){mem}{pages}")
    lines.append(
        f"found: {len(discovery.gpus)} GPUs, {len(discovery.fabric)} fabric devices with "
        f"{sum(len(f.vfs) for f in discovery.fabric)} VFs, {len(discovery.nvme)} NVMe namespaces"
    )
    if candidate.pairings:
        lines.append("slot evidence:")
    for p in candidate.pairings:
        g = p.gpu
        lines.append(
            f"  {p.slot_index}: gpu {g.pci_address} {g.model} ({g.vendor}:{g.device}) "
            f"driver {g.driver or 'none'}, iommu group {g.iommu_group}"
        )
        if p.fabric is not None:
            f = p.fabric
            port = "; ".join(f"port {x.port} {x.state} {x.link_layer} {x.rate or ''}".rstrip() for x in f.ports)
            vf = f"vf {p.vf.pci_address} driver {p.vf.driver or 'none'} of " if p.vf else "no vf; "
            lines.append(
                f"     {vf}{f.ib_device or 'no rdma device'} {f.pci_address} {f.model}, "
                f"{port or 'no port state'}, guid {f.node_guid or '?'}"
            )
        if p.disk is not None:
            d = p.disk
            state = (
                ", ".join(
                    filter(
                        None,
                        [
                            "os disk" if d.os_disk else "",
                            f"mounted at {', '.join(d.mountpoints)}" if d.mounted else "",
                            f"signature {d.signature}" if d.signature else "",
                            "header unreadable" if not d.signature_checked else "",
                        ],
                    )
                )
                or "clean"
            )
            lines.append(f"     disk {d.name} {_tb(d.size_bytes)} {d.model or ''} ({state})")
    if candidate.spare_vfs:
        lines.append(f"spare VFs: {', '.join(candidate.spare_vfs)}")
    if candidate.spare_disks:
        lines.append(f"spare disks: {', '.join(candidate.spare_disks)}")
    if candidate.slot_map is None:
        lines.append(
            "no GPU found: no candidate slot map"
            if not discovery.gpus
            else "no GPU could be given a disk: no candidate slot map"
        )
    return lines


def _comments(lines: list[str]) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def _dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)


def _node_yaml(candidate: candidates.Candidate, discovery: facts.Discovery) -> str:
    doc = proposals.node_document(candidate, discovery)
    head = [
        f"Proposed Node for {candidate.node}: keep it in this file or move it to nodes/{candidate.node}.yaml.",
        f"Replace every {proposals.PLACEHOLDER} (validate refuses it): region and pool from fleet.yaml.",
        "Add firmware_profile (version, ready) as recorded at onboarding, and baremetal_sku if the",
        "host is also leased whole. A Node has no approval_required: admin_state:",
        f"{proposals.PROPOSED_ADMIN_STATE.value} keeps the node out of the catalog until you set it active.",
    ]
    if doc["os_disk"] == proposals.PLACEHOLDER:
        head.append("os_disk: discovery found no by-id path for the OS disk; name it by hand.")
    return _comments(head) + _dump(doc)


def to_yaml(candidate: candidates.Candidate, discovery: facts.Discovery) -> str:
    head = _comments(_header(candidate, discovery))
    if candidate.slot_map is None:
        return head
    return head + _dump(slot_map_document(candidate.slot_map)) + "---\n" + _node_yaml(candidate, discovery)


def to_json(candidate: candidates.Candidate, discovery: facts.Discovery) -> str:
    doc = {
        "node": candidate.node,
        "candidate": slot_map_document(candidate.slot_map) if candidate.slot_map is not None else None,
        "node_document": proposals.node_document(candidate, discovery) if candidate.slot_map is not None else None,
        "summary": _summary_dict(proposals.summary(candidate)),
        "spare_vfs": list(candidate.spare_vfs),
        "spare_disks": list(candidate.spare_disks),
        "discovery": discovery.as_dict(),
    }
    return json.dumps(doc, indent=2) + "\n"


def _summary_dict(summary: proposals.Summary) -> dict[str, Any]:
    return {
        "ready": list(summary.ready),
        "blocked": {str(i): list(codes) for i, codes in sorted(summary.blocked.items())},
        "line": summary.line(),
    }
