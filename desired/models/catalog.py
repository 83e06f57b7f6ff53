"""What is sold: SKUs (with their VM and resource profiles) and the images they boot."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    Strict,
    model_validator,
)

from desired.models.base import CapacityShape, Fabric, Name, Timestamp, TopologyRule, _Doc, _Model

# ------------------------------------------------------------------------ Sku


class Hugepages(_Model):
    enabled: bool = False
    page_size: Literal["2M", "1G"] = "1G"


class VmProfile(_Model):
    gpu_count: int = Field(ge=1, le=8)
    vcpu_count: int = Field(ge=1, le=1024)
    memory_mib: int = Field(ge=512)
    hugepages: Hugepages = Hugepages.model_construct()
    guest_driver_profile: Name | None = None
    derived_from: Name | None = None  # a key of slice_vm_profiles
    notes: str = ""
    readiness_timeout_seconds: int | None = Field(
        default=None,
        ge=30,
        le=900,
        description="Seconds a VM of this profile has to pass readiness (30-900); wins over the SKU's and the "
        "Fleet's readiness_timeout_seconds. Snapshotted at placement: an edit changes no running VM.",
    )


class ResourceProfile(_Model):
    fabric: str | None = None
    slice_unit_gpu_count: int = Field(default=1, ge=1)
    default_slice_vm_profile: Name | None = None
    # Keys are profile names: they reach claims, plans, the host and every report, so they follow the name rule.
    slice_vm_profiles: dict[Name, VmProfile] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )


class TopologyPolicy(_Model):
    gpu_count_1: Annotated[TopologyRule, Strict(False)] = TopologyRule.ANY_HEALTHY_SLOT
    gpu_count_2: Annotated[TopologyRule, Strict(False)] = TopologyRule.NUMA_ALIGNED_PREFERRED
    gpu_count_4: Annotated[TopologyRule, Strict(False)] = TopologyRule.NUMA_ALIGNED_REQUIRED
    gpu_count_8: Annotated[TopologyRule, Strict(False)] = TopologyRule.FULL_HOST_SLOT_GROUP_REQUIRED

    def rule(self, gpu_count: int) -> TopologyRule:
        return {
            1: self.gpu_count_1,
            2: self.gpu_count_2,
            4: self.gpu_count_4,
            8: self.gpu_count_8,
        }.get(gpu_count, TopologyRule.NUMA_ALIGNED_REQUIRED)


class Sku(_Doc):
    kind: Literal["Sku"]
    sku: Name
    display_name: str = ""
    capacity_shape: Annotated[CapacityShape, Strict(False)]
    accelerator_vendor: Literal["nvidia", "amd"]
    accelerator_model: Name
    allowed_gpu_counts: Annotated[tuple[int, ...], Strict(False)] | None = None
    gpu_count: int | None = Field(default=None, ge=1, le=8)
    exclusive_node: bool = False
    same_node_required: bool = True
    network_fabric: Annotated[Fabric, Strict(False)]
    topology_policy: TopologyPolicy = TopologyPolicy.model_construct()
    resource_profile: ResourceProfile = ResourceProfile.model_construct()
    gpu_hourly_price_minor: int = Field(ge=0)
    currency: Literal["USD", "EUR"] = "USD"
    active: bool = True
    readiness_timeout_seconds: int | None = Field(
        default=None,
        ge=30,
        le=900,
        description="gpu_slice: seconds a VM of this SKU has to pass readiness (30-900); wins over the Fleet's "
        "readiness_timeout_seconds, a VM profile's own value wins over it. Snapshotted at placement.",
    )

    @model_validator(mode="after")
    def _shape_fields(self) -> Sku:
        if self.capacity_shape is CapacityShape.BAREMETAL:
            if self.gpu_count is None:
                raise ValueError("a baremetal SKU needs a fixed gpu_count")
            if self.allowed_gpu_counts is not None:
                raise ValueError("a baremetal SKU has a fixed gpu_count, not allowed_gpu_counts")
            if not self.exclusive_node:
                raise ValueError("a baremetal SKU must set exclusive_node: true")
            if self.readiness_timeout_seconds is not None:  # no VM, so no VM readiness gate to bound
                raise ValueError(
                    "readiness_timeout_seconds is for gpu_slice SKUs (a VM's readiness); a baremetal SKU has none"
                )
        else:
            if not self.allowed_gpu_counts:
                raise ValueError("a gpu_slice SKU needs allowed_gpu_counts")
            if self.gpu_count is not None:
                raise ValueError("a gpu_slice SKU uses allowed_gpu_counts, not gpu_count")
            if self.exclusive_node:
                raise ValueError("a gpu_slice SKU cannot be exclusive_node")
        return self

    @property
    def counts(self) -> tuple[int, ...]:
        if self.capacity_shape is CapacityShape.BAREMETAL:
            return (self.gpu_count or 0,)
        return tuple(sorted(set(self.allowed_gpu_counts or ())))


# ---------------------------------------------------------------------- Image


class Image(_Doc):
    kind: Literal["Image"]
    slug: Name
    display_name: str = ""
    version: str = "1"
    target: Literal["vm_slice", "baremetal"]
    family: Literal["ubuntu", "rocky", "debian", "custom"]
    architecture: Literal["amd64", "arm64"]
    accelerator_vendor: Literal["nvidia", "amd", "any"] = "any"
    accelerator_model: str | None = None
    network_fabric: Literal["infiniband", "roce", "ethernet", "none", "any"] = "any"
    image_format: Literal["maas", "qcow2", "raw", "oci"]
    source_type: Literal["maas", "platform_storage", "oci_artifact", "http", "file"]
    source_ref: str = Field(min_length=1, max_length=1024)
    digest_sha256: str | None = None
    size_bytes: int | None = Field(default=None, ge=0)
    cloud_init_supported: bool = True
    guest_agent_supported: bool = False
    default_username: Name
    driver_strategy: Literal["none", "preinstalled_nvidia", "preinstalled_rocm", "install_on_boot"]
    compatible_skus: Annotated[tuple[Name, ...], Strict(False)] = ()
    active: bool = True
    inactive_since: Timestamp | None = None
    cache_pinned: bool = False

    @property
    def immutable_source(self) -> bool:
        # MAAS aliases are resolved by MAAS itself; every other artifact is pinned by digest.
        return self.source_type != "maas"
