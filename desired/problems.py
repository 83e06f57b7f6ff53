"""Problems found in desired state, with stable codes.

Codes are part of the product's interface: CI jobs, the portal bot and
operators grep for them. Do not change the string values. Once set, they are set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from desired import codes as desired_codes


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
YAML_ENCODING = desired_codes.YAML_ENCODING
YAML_SYNTAX = desired_codes.YAML_SYNTAX
YAML_TAB = desired_codes.YAML_TAB_INDENT
YAML_DUPLICATE_KEY = desired_codes.YAML_DUPLICATE_KEY
YAML_TOO_DEEP = desired_codes.YAML_TOO_DEEP
YAML_TOO_LARGE = desired_codes.YAML_TOO_LARGE
YAML_ALIAS_BOMB = desired_codes.YAML_ALIAS_EXPANSION
YAML_UNSUPPORTED_TAG = desired_codes.YAML_UNSUPPORTED_TAG
YAML_NOT_MAPPING = desired_codes.YAML_NOT_A_MAPPING
YAML_KEY_NOT_STRING = desired_codes.YAML_KEY_NOT_STRING
YAML_DUPLICATE_ANCHOR = desired_codes.YAML_DUPLICATE_ANCHOR
FILE_SYMLINK = desired_codes.FILE_SYMLINK
FILE_NOT_REGULAR = desired_codes.FILE_NOT_REGULAR
FILE_UNREADABLE = desired_codes.FILE_UNREADABLE

# Documents and fields
DOC_API_VERSION = desired_codes.DOCUMENT_API_VERSION
DOC_KIND_MISSING = desired_codes.DOCUMENT_KIND_MISSING
DOC_KIND_UNKNOWN = desired_codes.DOCUMENT_KIND_UNKNOWN
FIELD_MISSING = desired_codes.FIELD_MISSING
FIELD_UNKNOWN = desired_codes.FIELD_UNKNOWN
FIELD_TYPE = desired_codes.FIELD_TYPE
FIELD_VALUE = desired_codes.FIELD_VALUE
# A renamed key under its old name: still read, with a warning naming the new key.
FIELD_DEPRECATED = desired_codes.FIELD_DEPRECATED

# Cross-file rules
DUPLICATE_NAME = desired_codes.NAME_DUPLICATE
REF_UNRESOLVED = desired_codes.REF_UNRESOLVED
FLEET_MISSING = desired_codes.FLEET_MISSING
FLEET_MULTIPLE = desired_codes.FLEET_MULTIPLE
NODE_PROFILE_TAGS = desired_codes.NODE_PROFILE_TAGS
NODE_SLOTMAP_MULTIPLE = desired_codes.NODE_SLOTMAP_MULTIPLE
SLOT_DUPLICATE_INDEX = desired_codes.SLOT_DUPLICATE_INDEX
SLOT_DUPLICATE_GPU = desired_codes.SLOT_DUPLICATE_GPU
SLOT_DUPLICATE_VF = desired_codes.SLOT_DUPLICATE_VF
SLOT_DUPLICATE_DISK = desired_codes.SLOT_DUPLICATE_DISK
SLOT_OS_DISK = desired_codes.SLOT_OS_DISK
SLOT_DUPLICATE_MAC = desired_codes.SLOT_DUPLICATE_MAC
SLOT_DUPLICATE_IP = desired_codes.SLOT_DUPLICATE_IP
SLOT_IP_OUTSIDE_SUBNET = desired_codes.SLOT_IP_OUTSIDE_SUBNET
SLOT_UNSCHEDULABLE = desired_codes.SLOT_UNSCHEDULABLE
SKU_GPU_COUNTS = desired_codes.SKU_GPU_COUNTS
SKU_PROFILE = desired_codes.SKU_VM_PROFILE
ALLOCATION_GPU_COUNT = desired_codes.ALLOCATION_GPU_COUNT
ALLOCATION_IMAGE = desired_codes.ALLOCATION_IMAGE_INCOMPATIBLE
ALLOCATION_PROFILE = desired_codes.ALLOCATION_VM_PROFILE
IMAGE_DIGEST = desired_codes.IMAGE_DIGEST
IMAGE_SOURCE_REF = desired_codes.IMAGE_SOURCE_REF
IMAGE_INACTIVE_SINCE = desired_codes.IMAGE_INACTIVE_SINCE
ALLOCATION_IMAGE_INACTIVE = desired_codes.ALLOCATION_IMAGE_INACTIVE
# A field of an allocation that holds claims changed (policies/immutables.py): a resize is a
# release and a new request, never an edit.
ALLOCATION_IMMUTABLE = desired_codes.ALLOCATION_IMMUTABLE
NETWORK_INVALID = desired_codes.NETWORK_INVALID
PROVIDER_DUPLICATE = desired_codes.PROVIDER_DUPLICATE
NODE_MACHINE_PROVIDER = desired_codes.NODE_MACHINE_PROVIDER
NODE_MACHINE_DUPLICATE = desired_codes.NODE_MACHINE_DUPLICATE
NODE_INGRESS_RANGE = desired_codes.NODE_INGRESS_RANGE
NODE_INGRESS_ADDRESS = desired_codes.NODE_INGRESS_ADDRESS
NODE_INGRESS_OVERLAP = desired_codes.NODE_INGRESS_OVERLAP
ALLOCATION_EXTRA_PORTS_LIMIT = desired_codes.ALLOCATION_EXTRA_PORTS_LIMIT
ALLOCATION_EXTRA_PORTS_DUPLICATE = desired_codes.ALLOCATION_EXTRA_PORTS_DUPLICATE
