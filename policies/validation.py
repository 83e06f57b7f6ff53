"""Cross-file rules over a parsed desired state: references, uniqueness, device safety.

Runs after every document parsed on its own. Each rule yields Problems that
point at the exact field that breaks it. Warnings name every slot that can
never be scheduled, so an operator sees why approved hardware sells nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import re
from collections.abc import Iterator

from desired import models as m
from desired import problems as p
from desired.state import DesiredState, LoadResult, Source
from policies import eligibility, images

_DIGEST = re.compile(m.DIGEST_RE)
_VALID_COUNTS = frozenset({1, 2, 4, 8})


def validate(result: LoadResult) -> LoadResult:
    """Add cross-file problems to a parse result (returns the same object)."""
    state = result.state
    result.problems.extend(_fleet(state))
    result.problems.extend(_skus(state))
    result.problems.extend(_images(state))
    result.problems.extend(_nodes(state))
    result.problems.extend(_slot_maps(state))
    result.problems.extend(_allocations(state))
    result.problems.extend(machine_duplicates(state))
    result.problems.extend(ingress_overlaps(state))
    return result


def _fleet(state: DesiredState) -> Iterator[p.Problem]:
    if state.fleet is None and state.file_count:
        yield p.Problem(p.FLEET_MISSING, "no Fleet document found; regions and pools are declared there", ".", 1, 1)
    yield from _deprecated_keys(state)
    yield from _providers(state)


def _deprecated_keys(state: DesiredState) -> Iterator[p.Problem]:
    """A renamed Fleet key still works; the warning names the line and the new key."""
    if state.fleet is None:
        return
    src = state.source("Fleet", state.fleet.name)
    for old, new in m.DEPRECATED_FLEET_KEYS.items():
        if getattr(state.fleet, old) is not None:
            yield src.at(
                old,
                code=p.FIELD_DEPRECATED,
                severity=p.Severity.WARNING,
                message=f"{old} is deprecated: rename it {new} (same meaning and range)",
                value=False,
            )


def _providers(state: DesiredState) -> Iterator[p.Problem]:
    """Machine providers (issue 30): unique names in Fleet.machine_providers."""
    if state.fleet is None:
        return
    src = state.source("Fleet", state.fleet.name)
    declared: set[str] = set()
    for i, prov in enumerate(state.fleet.machine_providers):
        if prov.name in declared:
            yield src.at(
                "machine_providers",
                i,
                "name",
                code=p.PROVIDER_DUPLICATE,
                message=f"machine provider {prov.name!r} is declared twice",
            )
        declared.add(prov.name)


def _node_machine(state: DesiredState, src: Source, node: m.Node) -> Iterator[p.Problem]:
    """A node's machine names a declared provider (a per-node rule: it reads only the Fleet)."""
    if node.machine is None:
        return
    declared = {prov.name for prov in state.fleet.machine_providers} if state.fleet else set()
    if node.machine.provider not in declared:
        yield src.at(
            "machine",
            "provider",
            code=p.NODE_MACHINE_PROVIDER,
            message=f"machine provider {node.machine.provider!r} is not declared in Fleet.machine_providers",
        )


def machine_duplicates(state: DesiredState) -> Iterator[p.Problem]:
    """One machine (provider + machine_id) serves one node: a cross-node rule, run on every validation."""
    seen: dict[tuple[str, str], str] = {}
    for name, node in state.nodes.items():
        if node.machine is None:
            continue
        key = (node.machine.provider, node.machine.machine_id)
        other = seen.setdefault(key, name)
        if other != name:
            yield state.source("Node", name).at(
                "machine",
                "machine_id",
                code=p.NODE_MACHINE_DUPLICATE,
                message=f"machine {key[1]!r} of provider {key[0]!r} is already node {other!r}",
            )


def _regions(state: DesiredState) -> dict[str, set[str]]:
    if state.fleet is None:
        return {}
    return {r.name: {pool.name for pool in r.pools} for r in state.fleet.regions}


def _skus(state: DesiredState) -> Iterator[p.Problem]:
    for name, sku in state.skus.items():
        src = state.source("Sku", name)
        if sku.allowed_gpu_counts is not None:
            for i, count in enumerate(sku.allowed_gpu_counts):
                if count not in _VALID_COUNTS:
                    yield src.at(
                        "allowed_gpu_counts",
                        i,
                        code=p.SKU_GPU_COUNTS,
                        message=f"GPU count {count} is not one of 1, 2, 4, 8",
                    )
        profiles = sku.resource_profile.slice_vm_profiles
        default = sku.resource_profile.default_slice_vm_profile
        if default is not None and default not in profiles:
            yield src.at(
                "resource_profile",
                "default_slice_vm_profile",
                code=p.SKU_PROFILE,
                message=f"default_slice_vm_profile {default!r} is not in slice_vm_profiles",
            )
        if sku.capacity_shape is m.CapacityShape.GPU_SLICE and default is None:
            yield src.at(
                "resource_profile",
                code=p.SKU_PROFILE,
                message="a gpu_slice SKU needs resource_profile.default_slice_vm_profile",
            )
        for pname, prof in profiles.items():
            if prof.derived_from is not None and prof.derived_from not in profiles:
                yield src.at(
                    "resource_profile",
                    "slice_vm_profiles",
                    pname,
                    "derived_from",
                    code=p.SKU_PROFILE,
                    message=f"derived_from {prof.derived_from!r} is not a profile of this SKU",
                )


def _images(state: DesiredState) -> Iterator[p.Problem]:
    for slug, image in state.images.items():
        src = state.source("Image", slug)
        if image.digest_sha256 is None:
            if image.immutable_source:
                yield src.at(
                    "source_type",
                    code=p.IMAGE_DIGEST,
                    message=f"digest_sha256 is required for source_type {image.source_type!r}",
                )
        elif not _DIGEST.match(image.digest_sha256):
            yield src.at(
                "digest_sha256", code=p.IMAGE_DIGEST, message="digest_sha256 must be 64 lowercase hex characters"
            )
        for i, sku in enumerate(image.compatible_skus):
            if sku not in state.skus:
                yield src.at("compatible_skus", i, code=p.REF_UNRESOLVED, message=f"unknown SKU {sku!r}")
        why = _source_ref_problem(image)
        if why is not None:
            yield src.at("source_ref", code=p.IMAGE_SOURCE_REF, message=why)
        if not image.active and image.inactive_since is None:
            yield src.at(
                "active",
                code=p.IMAGE_INACTIVE_SINCE,
                message="active: false needs inactive_since (allocations requested before it keep the image, "
                "later ones are refused)",
            )


_RELATIVE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,1023}$")


def _source_ref_problem(image: m.Image) -> str | None:
    """Why `source_ref` cannot be fetched as its source_type says (the host reads it the same way)."""
    ref = image.source_ref
    scheme, _, rest = ref.partition("://")
    if image.source_type == "http":
        host = rest.split("/", 1)[0]
        if scheme not in ("http", "https") or not host or any(c.isspace() for c in ref):
            return f"source_type http needs an http:// or https:// URL, not {ref!r}"
    elif image.source_type == "file":
        if scheme != "file" or not rest.startswith("/") or "/../" in f"{rest}/" or any(c.isspace() for c in ref):
            return f"source_type file needs a file:///ABSOLUTE/PATH URL, not {ref!r}"
    elif image.source_type == "platform_storage":
        parts = ref.split("/")
        if not _RELATIVE_REF.match(ref) or ".." in parts or "." in parts or "" in parts:
            return (
                f"source_type platform_storage needs a relative path under the image base URL "
                f"(letters, digits, . _ / + -; no '..'), not {ref!r}"
            )
    return None


def _nodes(state: DesiredState) -> Iterator[p.Problem]:
    regions = _regions(state)
    for name, node in state.nodes.items():
        src = state.source("Node", name)
        if state.fleet is not None:
            if node.region not in regions:
                yield src.at("region", code=p.REF_UNRESOLVED, message=f"unknown region {node.region!r}")
            elif node.pool not in regions[node.region]:
                yield src.at(
                    "pool",
                    code=p.REF_UNRESOLVED,
                    message=f"pool {node.pool!r} is not declared in region {node.region!r}",
                )
        profile = [t for t in node.profile_tags if t.startswith(m.PROFILE_TAG_PREFIX)]
        unknown = [t for t in node.profile_tags if t not in m.PROFILE_TAGS]
        misplaced = [t for t in node.hardware_tags if t.startswith(m.PROFILE_TAG_PREFIX)]
        if unknown:
            yield src.at(
                "profile_tags",
                code=p.NODE_PROFILE_TAGS,
                message=f"unknown profile tag(s) {', '.join(unknown)}; "
                f"use {m.PROFILE_SLICE_VM} or {m.PROFILE_BAREMETAL}",
            )
        elif misplaced:
            yield src.at(
                "hardware_tags", code=p.NODE_PROFILE_TAGS, message=f"profile tag {misplaced[0]} belongs in profile_tags"
            )
        elif len(profile) != 1:
            yield src.at(
                "profile_tags",
                code=p.NODE_PROFILE_TAGS,
                message=f"a node carries exactly one gpuaas profile tag, found {len(profile)}",
            )
        yield from _node_machine(state, src, node)
        yield from _node_ingress(src, node)
        if node.baremetal_sku is not None:
            sku = state.skus.get(node.baremetal_sku)
            if sku is None:
                yield src.at("baremetal_sku", code=p.REF_UNRESOLVED, message=f"unknown SKU {node.baremetal_sku!r}")
            elif sku.capacity_shape is not m.CapacityShape.BAREMETAL:
                yield src.at(
                    "baremetal_sku", code=p.REF_UNRESOLVED, message=f"SKU {node.baremetal_sku!r} is not a baremetal SKU"
                )


def _node_ingress(src: Source, node: m.Node) -> Iterator[p.Problem]:
    ing = node.ingress
    if ing is None:
        return
    if ing.port_first > ing.port_last:
        yield src.at(
            "ingress",
            "port_last",
            code=p.NODE_INGRESS_RANGE,
            message=f"ingress.port_last {ing.port_last} is below ingress.port_first {ing.port_first}",
        )
    if ing.address not in node.public_addresses:
        owned = ", ".join(node.public_addresses) or "none declared"
        yield src.at(
            "ingress",
            "address",
            code=p.NODE_INGRESS_ADDRESS,
            message=f"ingress.address {ing.address} is not one of node {node.name}'s public_addresses ({owned})",
        )


def ingress_overlaps(state: DesiredState) -> Iterator[p.Problem]:
    """Ingress port ranges of two nodes on one public address that share a port (fleet wide).

    One pass over the nodes that declare ingress (a handful of ranges per
    address), run on every validation: cheap, and it reads every node.
    """
    by_address: dict[str, list[tuple[int, int, str]]] = {}
    for name, node in state.nodes.items():
        ing = node.ingress
        if ing is not None and ing.port_first <= ing.port_last:
            by_address.setdefault(ing.address, []).append((ing.port_first, ing.port_last, name))
    for address, ranges in by_address.items():
        ranges.sort()
        for i, (first, last, name) in enumerate(ranges):
            for o_first, o_last, other in ranges[:i]:
                if o_last >= first:
                    yield state.source("Node", name).at(
                        "ingress",
                        "port_first",
                        code=p.NODE_INGRESS_OVERLAP,
                        message=f"ingress ports {first}-{last} on {address} overlap node {other}'s "
                        f"{o_first}-{o_last} on the same address",
                    )
                    break


def management_network(state: DesiredState, node: m.Node | None) -> m.ManagementNetwork:
    if node is not None and node.management_network is not None:
        return node.management_network
    return state.fleet.management_network if state.fleet else m.ManagementNetwork()


# Per slot map: (kind, field, code, label) of the values no two slots of one node may share.
_SLOT_UNIQUE_CHECKS = (
    ("index", "slot_index", p.SLOT_DUPLICATE_INDEX, "slot_index"),
    ("gpu", "gpu_pci_address", p.SLOT_DUPLICATE_GPU, "GPU"),
    ("vf", "fabric_vf_pci_address", p.SLOT_DUPLICATE_VF, "fabric VF"),
    ("disk", "nvme_device", p.SLOT_DUPLICATE_DISK, "NVMe disk"),
    ("ip", "private_ip", p.SLOT_DUPLICATE_IP, "private IP"),
)
_SLOT_UNIQUE = tuple(kind for kind, *_ in _SLOT_UNIQUE_CHECKS)


@functools.lru_cache(maxsize=256)
def _bounds(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, int]:
    """First and last address of a subnet as integers (a fleet has a few subnets; maps have 10,000s)."""
    return int(net.network_address), int(net.broadcast_address)


def _slot_maps(state: DesiredState, macs: dict[str, str] | None = None) -> Iterator[p.Problem]:
    """`macs`: MAC -> its first owner in maps validated before these (`policies.validationmemo` checks one map)."""
    macs = {} if macs is None else macs
    for node_name, smap in state.slot_maps.items():
        src = state.source("SlotMap", node_name)
        node = state.nodes.get(node_name)
        if node is None:
            yield src.at("node", code=p.REF_UNRESOLVED, message=f"slot map for unknown node {node_name!r}")
        net = management_network(state, node).network
        lo, hi = _bounds(net)
        v6 = net.version == 6
        os_disk = node.os_disk if node is not None else None
        seen: dict[str, dict[object, int]] = {k: {} for k in _SLOT_UNIQUE}
        for i, slot in enumerate(smap.slots):
            for key, fld, code, label in _SLOT_UNIQUE_CHECKS:
                value = getattr(slot, fld)
                if value is None:
                    continue
                first = seen[key].setdefault(value, i)
                if first != i:
                    yield src.at(
                        "slots",
                        i,
                        fld,
                        code=code,
                        message=f"{label} {value} is already used by slots[{first}] on node {node_name}",
                    )
            if node is not None and slot.nvme_device == os_disk:
                yield src.at(
                    "slots",
                    i,
                    "nvme_device",
                    code=p.SLOT_OS_DISK,
                    message=f"{slot.nvme_device} is the OS disk of node {node_name}; it can never be a slot disk",
                )
            ip = slot.private_ip
            if (":" in ip) != v6 or not lo <= m.ip_int(ip) <= hi:
                yield src.at(
                    "slots",
                    i,
                    "private_ip",
                    code=p.SLOT_IP_OUTSIDE_SUBNET,
                    message=f"private_ip {slot.private_ip} is outside the node's subnet {net}",
                )
            here = f"{node_name} slots[{i}]"
            owner = macs.setdefault(slot.mac_address, here)
            if owner != here:
                yield src.at(
                    "slots",
                    i,
                    "mac_address",
                    code=p.SLOT_DUPLICATE_MAC,
                    message=f"MAC {slot.mac_address} is already used by {owner}",
                )
            if slot.capacity_metadata.sku is not None and slot.capacity_metadata.sku not in state.skus:
                yield src.at(
                    "slots",
                    i,
                    "capacity_metadata",
                    "sku",
                    code=p.REF_UNRESOLVED,
                    message=f"unknown SKU {slot.capacity_metadata.sku!r}",
                )
        yield from _unschedulable(src, smap)


def _unschedulable(src: Source, smap: m.SlotMap) -> Iterator[p.Problem]:
    reasons = eligibility.eligible_slots(smap)
    for i, slot in enumerate(smap.slots):
        why = reasons.get(slot.slot_index, [])
        if why:
            text = "; ".join(r.message for r in why)
            codes = ",".join(r.code for r in why)
            yield src.at(
                "slots",
                i,
                code=p.SLOT_UNSCHEDULABLE,
                severity=p.Severity.WARNING,
                message=f"node {smap.node} slot {slot.slot_index} can never be scheduled ({codes}): {text}",
            )


def _allocations(state: DesiredState) -> Iterator[p.Problem]:
    regions = _regions(state)
    for aid, alloc in state.allocations.items():
        src = state.source("Allocation", aid)
        sku = state.skus.get(alloc.sku)
        if sku is None:
            yield src.at("sku", code=p.REF_UNRESOLVED, message=f"unknown SKU {alloc.sku!r}")
        elif alloc.gpu_count not in sku.counts:
            allowed = ", ".join(str(c) for c in sku.counts)
            yield src.at(
                "gpu_count",
                code=p.ALLOCATION_GPU_COUNT,
                message=f"SKU {alloc.sku} allows GPU counts {allowed}, not {alloc.gpu_count}",
            )
        if state.fleet is not None and alloc.region not in regions:
            yield src.at("region", code=p.REF_UNRESOLVED, message=f"unknown region {alloc.region!r}")
        if alloc.image is not None:
            image = state.images.get(alloc.image)
            if image is None:
                yield src.at("image", code=p.REF_UNRESOLVED, message=f"unknown image {alloc.image!r}")
            elif sku is not None and not _image_fits(image, sku):
                yield src.at(
                    "image",
                    code=p.ALLOCATION_IMAGE,
                    message=f"image {alloc.image} is not compatible with SKU {alloc.sku}",
                )
            elif _refused_inactive(image, alloc):
                yield src.at(
                    "image",
                    code=p.ALLOCATION_IMAGE_INACTIVE,
                    message=f"image {alloc.image} is not offered since {image.inactive_since}; "
                    f"this allocation was requested at {alloc.requested_at} (only earlier ones keep it)",
                )
        yield from _extra_ports(state, src, alloc)
        if (
            alloc.vm_profile is not None
            and sku is not None
            and alloc.vm_profile not in sku.resource_profile.slice_vm_profiles
        ):
            yield src.at(
                "vm_profile",
                code=p.ALLOCATION_PROFILE,
                message=f"SKU {alloc.sku} has no VM profile {alloc.vm_profile!r}",
            )


def _extra_ports(state: DesiredState, src: Source, alloc: m.Allocation) -> Iterator[p.Problem]:
    limit = state.fleet.ingress.max_extra_ports if state.fleet is not None else m.IngressSettings().max_extra_ports
    seen: set[int] = set()
    for i, port in enumerate(alloc.extra_ports):
        if i == limit:
            yield src.at(
                "extra_ports",
                i,
                code=p.ALLOCATION_EXTRA_PORTS_LIMIT,
                message=f"{len(alloc.extra_ports)} extra ports asked; the Fleet allows at most {limit} "
                "(ingress.max_extra_ports)",
            )
        if port == 22 or port in seen:
            why = "is SSH, always exposed" if port == 22 else "is listed twice"
            yield src.at(
                "extra_ports",
                i,
                code=p.ALLOCATION_EXTRA_PORTS_DUPLICATE,
                message=f"extra_ports[{i}]: port {port} {why}",
            )
        seen.add(port)


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def _refused_inactive(image: m.Image, alloc: m.Allocation) -> bool:
    """A new request of an image that is no longer offered; running (earlier) allocations keep it."""
    if image.active or image.inactive_since is None or alloc.state is m.AllocationState.RELEASED:
        return False
    return _utc(alloc.requested_at) >= _utc(image.inactive_since)


def _image_fits(image: m.Image, sku: m.Sku) -> bool:
    return images.fits(image, sku)
