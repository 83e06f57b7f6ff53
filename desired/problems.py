"""Problems found in desired state, with stable codes.

Codes are part of the product's interface: CI jobs, the portal bot and
operators grep for them. Do not change the string values. Once set, they are set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Problem:
    code: str
    message: str
    file: str
    line: int = 1
    column: int = 1
    severity: Severity = Severity.ERROR

    def render(self) -> str:
        prefix = "" if self.severity is Severity.ERROR else "warning: "
        return f"{self.file}:{self.line}:{self.column}: {prefix}{self.code}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "severity": self.severity.value,
        }


# YAML text and structure
YAML_ENCODING = "desired.yaml.encoding"
YAML_SYNTAX = "desired.yaml.syntax"
YAML_TAB = "desired.yaml.tab_indent"
YAML_DUPLICATE_KEY = "desired.yaml.duplicate_key"
YAML_TOO_DEEP = "desired.yaml.too_deep"
YAML_TOO_LARGE = "desired.yaml.too_large"
YAML_ALIAS_BOMB = "desired.yaml.alias_expansion"
YAML_UNSUPPORTED_TAG = "desired.yaml.unsupported_tag"
YAML_NOT_MAPPING = "desired.yaml.not_a_mapping"
YAML_KEY_NOT_STRING = "desired.yaml.key_not_string"
YAML_DUPLICATE_ANCHOR = "desired.yaml.duplicate_anchor"
FILE_SYMLINK = "desired.file.symlink"
FILE_NOT_REGULAR = "desired.file.not_regular"
FILE_UNREADABLE = "desired.file.unreadable"

# Documents and fields
DOC_API_VERSION = "desired.document.api_version"
DOC_KIND_MISSING = "desired.document.kind_missing"
DOC_KIND_UNKNOWN = "desired.document.kind_unknown"
FIELD_MISSING = "desired.field.missing"
FIELD_UNKNOWN = "desired.field.unknown"
FIELD_TYPE = "desired.field.type"
FIELD_VALUE = "desired.field.value"
# A renamed key under its old name: still read, with a warning naming the new key.
FIELD_DEPRECATED = "desired.field.deprecated"

# Cross-file rules
DUPLICATE_NAME = "desired.name.duplicate"
REF_UNRESOLVED = "desired.ref.unresolved"
FLEET_MISSING = "desired.fleet.missing"
FLEET_MULTIPLE = "desired.fleet.multiple"
NODE_PROFILE_TAGS = "desired.node.profile_tags"
NODE_SLOTMAP_MULTIPLE = "desired.node.slotmap_multiple"
SLOT_DUPLICATE_INDEX = "desired.slot.duplicate_index"
SLOT_DUPLICATE_GPU = "desired.slot.duplicate_gpu"
SLOT_DUPLICATE_VF = "desired.slot.duplicate_vf"
SLOT_DUPLICATE_DISK = "desired.slot.duplicate_disk"
SLOT_OS_DISK = "desired.slot.os_disk"
SLOT_DUPLICATE_MAC = "desired.slot.duplicate_mac"
SLOT_DUPLICATE_IP = "desired.slot.duplicate_ip"
SLOT_IP_OUTSIDE_SUBNET = "desired.slot.ip_outside_subnet"
SLOT_UNSCHEDULABLE = "desired.slot.unschedulable"
SKU_GPU_COUNTS = "desired.sku.gpu_counts"
SKU_PROFILE = "desired.sku.vm_profile"
ALLOCATION_GPU_COUNT = "desired.allocation.gpu_count"
ALLOCATION_IMAGE = "desired.allocation.image_incompatible"
ALLOCATION_PROFILE = "desired.allocation.vm_profile"
IMAGE_DIGEST = "desired.image.digest"
IMAGE_SOURCE_REF = "desired.image.source_ref"
IMAGE_INACTIVE_SINCE = "desired.image.inactive_since"
ALLOCATION_IMAGE_INACTIVE = "desired.allocation.image_inactive"
# A field of an allocation that holds claims changed (policies/immutables.py): a resize is a
# release and a new request, never an edit.
ALLOCATION_IMMUTABLE = "desired.allocation.immutable"
NETWORK_INVALID = "desired.network.invalid"
PROVIDER_DUPLICATE = "desired.provider.duplicate"
NODE_MACHINE_PROVIDER = "desired.node.machine_provider"
NODE_MACHINE_DUPLICATE = "desired.node.machine_duplicate"
NODE_INGRESS_RANGE = "desired.node.ingress_range"
NODE_INGRESS_ADDRESS = "desired.node.ingress_address"
NODE_INGRESS_OVERLAP = "desired.node.ingress_overlap"
ALLOCATION_EXTRA_PORTS_LIMIT = "desired.allocation.extra_ports_limit"
ALLOCATION_EXTRA_PORTS_DUPLICATE = "desired.allocation.extra_ports_duplicate"
