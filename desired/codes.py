"""Stable codes of problems found in desired state (files, documents, fields, cross-file rules).

Codes are part of the product's interface: operators, CI jobs and the portal match on them.
Do not change the string values. Once set, they are set. Each constant has its one-line meaning
above it; docs/error-codes.md is generated from these lines (python -m tests.errorcodes --write).
"""

from __future__ import annotations

# an allocation lists an extra port twice, or 22 (SSH is always exposed)
ALLOCATION_EXTRA_PORTS_DUPLICATE = "desired.allocation.extra_ports_duplicate"
# an allocation asks more extra ports than the Fleet's ingress.max_extra_ports
ALLOCATION_EXTRA_PORTS_LIMIT = "desired.allocation.extra_ports_limit"
# an allocation's gpu_count is not one its SKU allows
ALLOCATION_GPU_COUNT = "desired.allocation.gpu_count"
# an allocation names an image that is inactive (or inactive since before it was created)
ALLOCATION_IMAGE_INACTIVE = "desired.allocation.image_inactive"
# an allocation's image does not fit its SKU (another target or capacity shape)
ALLOCATION_IMAGE_INCOMPATIBLE = "desired.allocation.image_incompatible"
# a field of an allocation that holds claims changed: a resize is a release and a new request
ALLOCATION_IMMUTABLE = "desired.allocation.immutable"
# an allocation names a VM profile its SKU does not offer
ALLOCATION_VM_PROFILE = "desired.allocation.vm_profile"
# a document's apiVersion is not gpuaas.io/v1alpha1
DOCUMENT_API_VERSION = "desired.document.api_version"
# a document has no kind
DOCUMENT_KIND_MISSING = "desired.document.kind_missing"
# a document's kind is not one of the known kinds
DOCUMENT_KIND_UNKNOWN = "desired.document.kind_unknown"
# warning: a renamed key under its old name (still read); the message names the new key
FIELD_DEPRECATED = "desired.field.deprecated"
# a required field of a document is missing
FIELD_MISSING = "desired.field.missing"
# a field has the wrong type (strict: "4" is not an integer)
FIELD_TYPE = "desired.field.type"
# a document has a field its kind does not know (a typo is never ignored)
FIELD_UNKNOWN = "desired.field.unknown"
# a field's value is out of range or not in its vocabulary
FIELD_VALUE = "desired.field.value"
# a file that is not a regular file (a FIFO, socket or device) is not read
FILE_NOT_REGULAR = "desired.file.not_regular"
# a symbolic link is not followed; only regular files inside the repo are read
FILE_SYMLINK = "desired.file.symlink"
# a file of the repo cannot be read (an I/O or permission error)
FILE_UNREADABLE = "desired.file.unreadable"
# the repo has no Fleet document (regions and pools are declared there)
FLEET_MISSING = "desired.fleet.missing"
# the repo has more than one Fleet document
FLEET_MULTIPLE = "desired.fleet.multiple"
# the git revision asked for cannot be read (unknown ref, or not a commit)
GIT_REVISION = "desired.git.revision"
# an image's digest_sha256 is missing or not 64 lowercase hex characters
IMAGE_DIGEST = "desired.image.digest"
# an image's inactive_since is set while it is active, or lies in the future
IMAGE_INACTIVE_SINCE = "desired.image.inactive_since"
# an image's source_ref does not fit its source_type (an http(s) URL, a file:/// URL, ...)
IMAGE_SOURCE_REF = "desired.image.source_ref"
# two documents of one kind share a name
NAME_DUPLICATE = "desired.name.duplicate"
# a management network is invalid (subnet, gateway or DHCP range outside it)
NETWORK_INVALID = "desired.network.invalid"
# a node's ingress.address is not among its public_addresses
NODE_INGRESS_ADDRESS = "desired.node.ingress_address"
# two nodes' ingress ranges on one address share a port
NODE_INGRESS_OVERLAP = "desired.node.ingress_overlap"
# a node's ingress port range is empty or outside 1024-65535
NODE_INGRESS_RANGE = "desired.node.ingress_range"
# two nodes name the same machine of one machine provider
NODE_MACHINE_DUPLICATE = "desired.node.machine_duplicate"
# a node's machine.provider is not declared in Fleet.machine_providers
NODE_MACHINE_PROVIDER = "desired.node.machine_provider"
# a node does not carry exactly one gpuaas-profile-* tag
NODE_PROFILE_TAGS = "desired.node.profile_tags"
# a node has more than one SlotMap
NODE_SLOTMAP_MULTIPLE = "desired.node.slotmap_multiple"
# two machine providers of the Fleet share a name
PROVIDER_DUPLICATE = "desired.provider.duplicate"
# a reference names a document that does not exist (a SKU, image, node, profile)
REF_UNRESOLVED = "desired.ref.unresolved"
# a SKU allows a GPU count other than 1, 2, 4 or 8
SKU_GPU_COUNTS = "desired.sku.gpu_counts"
# a SKU's default VM profile is not one of its slice_vm_profiles
SKU_VM_PROFILE = "desired.sku.vm_profile"
# two slots of a node share an NVMe disk
SLOT_DUPLICATE_DISK = "desired.slot.duplicate_disk"
# two slots of a node share a GPU PCI address
SLOT_DUPLICATE_GPU = "desired.slot.duplicate_gpu"
# two slots of a slot map share a slot_index
SLOT_DUPLICATE_INDEX = "desired.slot.duplicate_index"
# two slots share a private IP address
SLOT_DUPLICATE_IP = "desired.slot.duplicate_ip"
# two slots share a MAC address (fleet-wide)
SLOT_DUPLICATE_MAC = "desired.slot.duplicate_mac"
# two slots share a fabric VF PCI address
SLOT_DUPLICATE_VF = "desired.slot.duplicate_vf"
# a slot's private IP lies outside its node's management subnet
SLOT_IP_OUTSIDE_SUBNET = "desired.slot.ip_outside_subnet"
# a slot's NVMe disk is its node's OS disk
SLOT_OS_DISK = "desired.slot.os_disk"
# warning: an approved slot can never be scheduled; the message says why
SLOT_UNSCHEDULABLE = "desired.slot.unschedulable"
# YAML aliases expand past the limit (an alias bomb)
YAML_ALIAS_EXPANSION = "desired.yaml.alias_expansion"
# a YAML anchor is defined twice in one document
YAML_DUPLICATE_ANCHOR = "desired.yaml.duplicate_anchor"
# a mapping has the same key twice
YAML_DUPLICATE_KEY = "desired.yaml.duplicate_key"
# the file is not UTF-8
YAML_ENCODING = "desired.yaml.encoding"
# a mapping key is not a plain string (a merge key << or a non-scalar key)
YAML_KEY_NOT_STRING = "desired.yaml.key_not_string"
# a document is not a mapping
YAML_NOT_A_MAPPING = "desired.yaml.not_a_mapping"
# the file is not valid YAML
YAML_SYNTAX = "desired.yaml.syntax"
# the file indents with a tab
YAML_TAB_INDENT = "desired.yaml.tab_indent"
# the YAML nests deeper than the limit
YAML_TOO_DEEP = "desired.yaml.too_deep"
# the file is larger than the limit
YAML_TOO_LARGE = "desired.yaml.too_large"
# a YAML tag other than the plain types (!!python/..., custom tags)
YAML_UNSUPPORTED_TAG = "desired.yaml.unsupported_tag"
# a git ref name is not a safe branch or tag name
GITOPS_REF_NAME = "gitops.ref_name"
