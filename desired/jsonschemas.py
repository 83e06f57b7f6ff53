"""JSON Schemas of the desired-state kinds, generated from the models.

The committed files under schemas/ are what editors use
(`# yaml-language-server: $schema=...`); a test fails when they drift from
the models, and `gpuaas schema --write schemas` regenerates them.

A schema is as strict as `gpuaas validate` on every rule about one
document that JSON Schema can state (tests/desired/test_schema_agreement.py
mutates the example documents field by field and compares the verdicts):

- what pydantic derives from the models (types, patterns, ranges, enums);
- formats the models check in code: IP addresses (`Slot.private_ip`, the
  management network's gateway and DHCP range), subnets, timestamps;
- conditional rules (`if`/`then`): a baremetal SKU has a fixed `gpu_count`
  and `exclusive_node: true`, a gpu_slice SKU a non-empty
  `allowed_gpu_counts` and a default VM profile; an image other than a MAAS
  alias is pinned by `digest_sha256`;
- the single-document rules of `policies.validation`: GPU counts 1, 2, 4 or 8,
  exactly one known profile tag, no profile tag among the hardware tags, a
  digest of 64 lowercase hex characters.

Rules relating two values are left to `gpuaas validate` (a gateway inside its
subnet, DHCP start before end, a default VM profile that names a profile of
the SKU, unique slot devices), as are rules across documents.

Every field carries a `description` (editors show it as help): the model's
own `Field(description=...)` where it has one, else DESCRIPTIONS below; a
test fails on a field without one.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from desired import models as m

SCHEMA_ID = "https://gpuaas.io/schemas/v1alpha1/{kind}.schema.json"

_IPV6_LOOSE = r"^[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*$"
_PREFIX4 = r"(/(3[0-2]|[12]?[0-9]))?"
_PREFIX6 = r"(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"
IP_ADDRESS: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": m.IPV4_RE},
        {"type": "string", "format": "ipv6", "pattern": _IPV6_LOOSE},
    ]
}
IP_NETWORK: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": m.IPV4_RE.removesuffix("$") + _PREFIX4 + "$"},
        {"type": "string", "pattern": _IPV6_LOOSE.removesuffix("$") + _PREFIX6 + "$"},
    ]
}
GPU_COUNTS = [1, 2, 4, 8]  # policies.validation: desired.sku.gpu_counts

# (model, field) -> what the schema adds to that property: formats the models check in code.
FIELD_RULES: dict[tuple[str, str], dict[str, Any]] = {
    ("Slot", "private_ip"): IP_ADDRESS,
    ("ManagementNetwork", "subnet"): IP_NETWORK,
    ("ManagementNetwork", "gateway"): IP_ADDRESS,
    ("DhcpRange", "start"): IP_ADDRESS,
    ("DhcpRange", "end"): IP_ADDRESS,
    ("Node", "profile_tags"): {"items": {"enum": sorted(m.PROFILE_TAGS)}, "minItems": 1, "maxItems": 1},
    ("Node", "hardware_tags"): {"items": {"not": {"pattern": f"^{m.PROFILE_TAG_PREFIX}"}}},
    # Keys are GPU counts, read as integers the lax way YAML keys need ("1", "+1", " 1").
    ("PlacementSettings", "workload_mix"): {"propertyNames": {"pattern": r"^\s*[+-]?[0-9][0-9_]*(\.0*)?\s*$"}},
}

# kind -> conditional rules of the whole document (allOf).
DOCUMENT_RULES: dict[str, list[dict[str, Any]]] = {
    "Sku": [
        {
            "if": {"required": ["capacity_shape"], "properties": {"capacity_shape": {"const": "baremetal"}}},
            "then": {
                "required": ["gpu_count", "exclusive_node"],
                "properties": {
                    "gpu_count": {"type": "integer"},
                    "exclusive_node": {"const": True},
                    "allowed_gpu_counts": {"type": "null"},
                    "readiness_timeout_seconds": {"type": "null"},
                },
            },
        },  # no VM: no readiness gate
        {
            "if": {"required": ["capacity_shape"], "properties": {"capacity_shape": {"const": "gpu_slice"}}},
            "then": {
                "required": ["allowed_gpu_counts", "resource_profile"],
                "properties": {
                    "allowed_gpu_counts": {"type": "array", "minItems": 1},
                    "gpu_count": {"type": "null"},
                    "exclusive_node": {"const": False},
                    "resource_profile": {
                        "required": ["default_slice_vm_profile"],
                        "properties": {"default_slice_vm_profile": {"type": "string"}},
                    },
                },
            },
        },
    ],
    "Image": [
        {
            "if": {"required": ["source_type"], "properties": {"source_type": {"not": {"const": "maas"}}}},
            "then": {"required": ["digest_sha256"], "properties": {"digest_sha256": {"type": "string"}}},
        },
    ],
}

_API = "Always gpuaas.io/v1alpha1."
_NAME = "lowercase letters, digits, '.', '_' or '-', 1-63 characters"
# model -> field -> help text, for fields whose model gives none (Field(description=...) wins).
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "Fleet": {
        "apiVersion": _API,
        "kind": "Always Fleet: the one document of fleet-wide settings.",
        "name": f"Name of the fleet ({_NAME}).",
        "regions": "Regions and their pools; nodes and allocations name a region and a pool declared here.",
        "management_network": "Default private management network of every slice host (a Node may override it).",
        "placement": "Placement policy settings of the central reconciler.",
        "graceful_shutdown_timeout_s": "Seconds a VM gets to shut down gracefully on release before it is "
        "stopped hard (1-3600).",
        "readiness_timeout_s": "Seconds a new VM has to report ready before provisioning counts as failed (1-3600).",
    },
    "Region": {"name": f"Region name ({_NAME}).", "pools": "Pools of this region (at least one)."},
    "Pool": {"name": f"Pool name ({_NAME}).", "description": "Free text for people."},
    "ManagementNetwork": {
        "subnet": "Subnet of the per-host management network, as CIDR (10.100.0.0/24); host bits must be zero.",
        "gateway": "Gateway address the host bridge holds; inside the subnet.",
        "dhcp_range": "Addresses dnsmasq may hand out; inside the subnet, start not after end.",
        "bridge": f"Linux bridge of the management network on each host ({_NAME}).",
    },
    "DhcpRange": {"start": "First address of the DHCP range.", "end": "Last address of the DHCP range."},
    "PlacementSettings": {
        "policy": "Placement policy: default (best fit, keeps whole nodes free), first-fit, k8s-least-allocated, "
        "k8s-most-allocated or seed-rank.",
        "max_claim_attempts": "How many candidate nodes apply tries for one placement after lost races (1-100).",
        "workload_mix": "Expected request-size mix, GPU count -> share; weights the fragmentation score.",
    },
    "Sku": {
        "apiVersion": _API,
        "kind": "Always Sku: a product sold to tenants.",
        "sku": f"SKU name, referenced by nodes, images, slots and allocations ({_NAME}).",
        "display_name": "Name shown to people.",
        "capacity_shape": "baremetal: one allocation leases a whole node; gpu_slice: a VM owning 1, 2, 4 or 8 "
        "approved slots of one node.",
        "accelerator_vendor": "GPU vendor: nvidia or amd.",
        "accelerator_model": f"GPU model, matched against slots and images ({_NAME}).",
        "allowed_gpu_counts": "gpu_slice only: the GPU counts a request may ask for, each 1, 2, 4 or 8 (at least one).",
        "gpu_count": "baremetal only: the fixed GPU count of the node (1-8).",
        "exclusive_node": "True for baremetal (required), false for gpu_slice: the allocation owns the whole node.",
        "same_node_required": "All GPUs of one allocation come from one node.",
        "network_fabric": "Fabric the SKU is sold with: infiniband, roce, ethernet or none.",
        "topology_policy": "Topology rule per GPU count (which slot sets are acceptable).",
        "resource_profile": "VM profiles of a gpu_slice SKU: CPU, memory and hugepages per GPU count.",
        "gpu_hourly_price_minor": "Price per GPU-hour in minor units of the currency (cents).",
        "currency": "Currency of the price: USD or EUR.",
        "active": "False stops new allocations of this SKU; running ones keep their claims.",
    },
    "TopologyPolicy": {f"gpu_count_{n}": f"Topology rule for {n}-GPU requests." for n in (1, 2, 4, 8)},
    "ResourceProfile": {
        "fabric": "Fabric label of the profile set (informational).",
        "slice_unit_gpu_count": "GPUs per slice unit (at least 1).",
        "default_slice_vm_profile": "gpu_slice: the VM profile used when a request names none; a key of "
        "slice_vm_profiles (required for gpu_slice).",
        "slice_vm_profiles": f"VM profiles by name ({_NAME}); profiles of other GPU counts may be derived_from one.",
    },
    "VmProfile": {
        "gpu_count": "GPUs of a VM with this profile (1-8).",
        "vcpu_count": "vCPUs of the VM (1-1024).",
        "memory_mib": "Memory of the VM in MiB (at least 512).",
        "hugepages": "Back the VM's memory with hugepages.",
        "guest_driver_profile": f"Guest driver profile the image must provide ({_NAME}).",
        "derived_from": "Name of the profile this one scales from; a key of the same slice_vm_profiles.",
        "notes": "Free text for people.",
    },
    "Hugepages": {"enabled": "Use hugepages for the VM's memory.", "page_size": "Hugepage size: 2M or 1G."},
    "Image": {
        "apiVersion": _API,
        "kind": "Always Image: an OS image a VM or node boots.",
        "slug": f"Image name, referenced by allocations ({_NAME}).",
        "display_name": "Name shown to people.",
        "version": "Version label of the image.",
        "target": "What boots it: vm_slice (a slice VM) or baremetal (a whole node).",
        "family": "OS family: ubuntu, rocky, debian or custom.",
        "architecture": "CPU architecture: amd64 or arm64.",
        "accelerator_vendor": "GPU vendor the image's drivers serve (nvidia, amd, or any).",
        "accelerator_model": "GPU model the image is built for (absent: any).",
        "network_fabric": "Fabric the image's drivers serve (infiniband, roce, ethernet, none, or any).",
        "image_format": "Artifact format: maas, qcow2, raw or oci.",
        "source_type": "Where the artifact comes from: maas, platform_storage (a path under the fleet's or "
        "host's image base URL), oci_artifact, http (an http(s) URL) or file (a file:/// URL, "
        "labs).",
        "source_ref": "Location of the artifact within its source (1-1024 characters): a relative path for "
        "platform_storage, an http:// or https:// URL for http, a file:/// URL for file.",
        "digest_sha256": "sha256 of the artifact, 64 lowercase hex characters; required unless source_type is "
        "maas (verified before a disk is written).",
        "size_bytes": "Size of the artifact in bytes.",
        "cloud_init_supported": "The image runs cloud-init (SSH keys and hostname are delivered that way).",
        "guest_agent_supported": "The image runs a guest agent.",
        "default_username": f"Login user the SSH keys are installed for ({_NAME}).",
        "driver_strategy": "How GPU drivers get there: none, preinstalled_nvidia, preinstalled_rocm or "
        "install_on_boot.",
        "compatible_skus": "SKUs this image may run on (empty: decided by vendor, model and fabric).",
        "active": "False stops new allocations with this image (requested at or after inactive_since); "
        "allocations requested before keep it.",
        "cache_pinned": "True: a host that caches this image never evicts it (a golden image kept warm); "
        "false: evictable once no VM of the host uses it.",
        "inactive_since": "When the image stopped being offered (required with active: false); allocations "
        "requested before it keep the image.",
    },
    "Node": {
        "apiVersion": _API,
        "kind": "Always Node: one physical GPU host.",
        "name": f"Host name of the node ({_NAME}); a SlotMap with the same node name approves its slots.",
        "region": "Region of the node, declared in the Fleet.",
        "pool": "Pool of the node, declared under its region in the Fleet.",
        "hardware_tags": "Free hardware tags (never a gpuaas-profile-* tag).",
        "profile_tags": "Exactly one of gpuaas-profile-slice-vm (may serve slices) or gpuaas-profile-baremetal.",
        "baremetal_sku": "The baremetal SKU this node is sold as when leased whole.",
        "admin_state": "active, draining (no new placements; running allocations stay) or maintenance.",
        "storage_mode": "Who owns the NVMe pool: slice (raw disks for tenant slices) or share (the host).",
        "os_disk": "The host's OS disk as /dev/disk/by-id/<name>; never used for a slot.",
        "org": "Organisation the node is dedicated to (absent: shared by every tenant).",
        "firmware_profile": "Onboarding evidence of the firmware profile; a host's own report wins over it.",
        "management_network": "This node's management network, overriding the Fleet's.",
    },
    "FirmwareProfile": {
        "version": "Firmware profile version.",
        "ready": "The profile is applied and the node may serve slices.",
    },
    "SlotMap": {
        "apiVersion": _API,
        "kind": "Always SlotMap: the approved slots of one node.",
        "node": "Name of the Node whose slots these are.",
        "approval_required": "True while an operator has not approved the map: no slot is schedulable.",
        "slots": "The slots: each a GPU with its own fabric VF, raw NVMe disk, NUMA node and MAC/IP.",
    },
    "Slot": {
        "slot_index": "Index of the slot on its node (0-255), unique in the map.",
        "gpu_pci_address": "PCI address of the GPU, like 0000:1b:00.0.",
        "gpu_model": "GPU model as discovered.",
        "gpu_uuid": "GPU UUID as the driver reports it.",
        "numa_node": "NUMA node of the GPU (0-64).",
        "slot_group": f"Slot group (a NUMA-aligned set of slots, {_NAME}); 4 GPUs take a whole group.",
        "pcie_pair": "Slots sharing a PCIe switch; 2-GPU requests prefer a pair.",
        "nvme_device": "The slot's raw NVMe disk as /dev/disk/by-id/<name>; wiped on release.",
        "nvme_identity": "The disk as discovery read it; the host refuses to touch a disk that differs.",
        "network_fabric": "Fabric of the slot: infiniband, roce, ethernet or none.",
        "fabric_vf_pci_address": "PCI address of the slot's own SR-IOV fabric VF (unique on the node).",
        "fabric_parent_device": "PCI address of the VF's physical function.",
        "fabric_claim_mode": "per_slot_vf (schedulable), exclusive_device or shared_host.",
        "mac_address": "MAC of the VM's management NIC for this slot (lowercase, unique in the fleet).",
        "private_ip": "Management IP reserved for this slot (an address inside the node's management subnet).",
        "vcpu_count": "vCPUs this slot contributes (at least 1).",
        "memory_mib": "Memory this slot contributes in MiB (at least 512).",
        "sharing_model": "How the GPU is shared; only exclusive_device is schedulable.",
        "max_claims": "Claims the slot may hold at once; only 1 is schedulable.",
        "parent_slot_id": "Parent slot of a partition; a slot with a parent is not schedulable.",
        "compute_milli": "Share of the GPU's compute in thousandths; below 1000 is not schedulable.",
        "capacity_metadata": "Storage ownership, wipe policy and SKU pin of the slot.",
        "enabled": "False takes the slot out of service (its claim, if any, stays).",
        "blockers": "Problems discovery found; a slot with blockers is not schedulable.",
    },
    "CapacityMetadata": {
        "storage_ownership": "Who owns the disk: slice (schedulable), share or host.",
        "destructive_wipe_policy": "How the disk is wiped on release; required for a schedulable slot.",
        "sku": "Pins the slot to one SKU.",
    },
    "Blocker": {"code": "Stable code of the problem.", "message": "What discovery found."},
    "NvmeIdentity": {
        "model": "Disk model as sysfs reports it.",
        "serial": "Disk serial as sysfs reports it.",
        "wwid": "World-wide id of the namespace (eui., nvme., uuid. or naa.).",
        "size_bytes": "Size in bytes, a multiple of 512.",
        "backing_file": "Loop devices (lab hosts): the backing file.",
    },
    "Allocation": {
        "apiVersion": _API,
        "kind": "Always Allocation: one tenant request.",
        "id": f"Allocation id: lowercase letters, digits and '-', 3-{m.ALLOCATION_ID_MAX} characters (its VM "
        f"name {m.VM_NAME_PREFIX}<id> is a hostname, a DNS label of at most {m.DNS_LABEL_MAX}).",
        "tenant": f"Tenant (organisation) the allocation belongs to ({_NAME}).",
        "sku": "SKU requested.",
        "gpu_count": "GPUs requested (1-8); one of the SKU's allowed_gpu_counts.",
        "region": "Region requested, declared in the Fleet.",
        "image": "Image to boot (gpu_slice), compatible with the SKU.",
        "ssh_keys": "OpenSSH public keys installed for the image's default user.",
        "vm_profile": "VM profile of the SKU to use (absent: the SKU's default for this GPU count).",
        "state": "present (place and run it) or released (stop it, wipe its disks, free its slots). Deleting "
        "the file releases nothing.",
        "requested_at": "When the request was made, like 2026-11-20T09:05:00Z (quoted or not; no offset: UTC); "
        "placement order.",
    },
}


def _model_name(schema: dict[str, Any], fallback: str) -> str:
    return str(schema.get("title", fallback))


def _complete(name: str, schema: dict[str, Any]) -> None:
    """Add FIELD_RULES and missing descriptions to one model's properties."""
    texts = DESCRIPTIONS.get(name, {})
    for field_name, prop in schema.get("properties", {}).items():
        rule = FIELD_RULES.get((name, field_name))
        if rule is not None:
            _merge(prop, copy.deepcopy(rule))
        if "description" not in prop and field_name in texts:
            prop["description"] = texts[field_name]


def _merge(prop: dict[str, Any], rule: dict[str, Any]) -> None:
    """Apply `rule` to a property, to the array/string branch of an optional (anyOf with null) one."""
    branches = prop.get("anyOf")
    if isinstance(branches, list) and any(b.get("type") == "null" for b in branches) and "anyOf" not in rule:
        target = next(b for b in branches if b.get("type") != "null")
    else:
        target = prop
    for key, value in rule.items():
        if key == "items" and isinstance(target.get("items"), dict):
            target["items"] = {**target["items"], **value}
        else:
            target[key] = value


def generate() -> dict[str, dict[str, Any]]:
    """kind -> JSON Schema (draft 2020-12) for every desired-state kind."""
    out: dict[str, dict[str, Any]] = {}
    for kind, model in sorted(m.KINDS.items()):
        schema = model.model_json_schema(by_alias=True, mode="validation")
        for name, sub in schema.get("$defs", {}).items():
            _complete(_model_name(sub, name), sub)
        _complete(kind, schema)
        if kind == "Sku":  # policies.validation: desired.sku.gpu_counts
            _merge(schema["properties"]["allowed_gpu_counts"], {"items": {"enum": GPU_COUNTS}})
        if kind == "Image":  # policies.validation: desired.image.digest
            _merge(schema["properties"]["digest_sha256"], {"pattern": m.DIGEST_RE})
        if kind in DOCUMENT_RULES:
            schema["allOf"] = copy.deepcopy(DOCUMENT_RULES[kind])
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": SCHEMA_ID.format(kind=kind),
            **schema,
        }
        out[kind] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def filename(kind: str) -> str:
    return f"{kind}.schema.json"
