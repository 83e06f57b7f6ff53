-- Inventory: what the desired state at a git revision declares, projected into rows.
--
-- Rows are upserted by `reconciler.store.inventory.sync` and never deleted:
-- a node, slot, SKU, image or allocation that disappears from git is marked
-- `present = false` (claims and billing history keep referencing it).

CREATE TABLE desired_revisions (
    revision      text PRIMARY KEY,            -- git SHA, or "tree:<content hash>" for a plain directory
    content_hash  text NOT NULL,               -- sha256 of the typed desired state
    file_count    integer NOT NULL,
    counts        jsonb NOT NULL DEFAULT '{}',
    recorded_at   timestamptz NOT NULL DEFAULT now()
);

-- The Fleet document (one row): management network and placement settings.
CREATE TABLE fleet_settings (
    singleton                   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    name                        text NOT NULL,
    management_network          jsonb NOT NULL,
    placement                   jsonb NOT NULL,
    graceful_shutdown_timeout_s integer NOT NULL,
    readiness_timeout_s         integer NOT NULL,
    revision                    text,
    updated_at                  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sku_catalog (
    sku                    text PRIMARY KEY,
    display_name           text NOT NULL DEFAULT '',
    capacity_shape         text NOT NULL CHECK (capacity_shape IN ('baremetal', 'gpu_slice')),
    accelerator_vendor     text NOT NULL,
    accelerator_model      text NOT NULL,
    allowed_gpu_counts     integer[] NOT NULL,
    gpu_count              integer,
    exclusive_node         boolean NOT NULL,
    network_fabric         text NOT NULL,
    topology_policy        jsonb NOT NULL DEFAULT '{}',
    resource_profile       jsonb NOT NULL DEFAULT '{}',
    gpu_hourly_price_minor integer NOT NULL CHECK (gpu_hourly_price_minor >= 0),
    currency               text NOT NULL,
    active                 boolean NOT NULL,
    present                boolean NOT NULL DEFAULT true,
    revision               text,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE os_images (
    slug                  text PRIMARY KEY,
    display_name          text NOT NULL DEFAULT '',
    version               text NOT NULL,
    target                text NOT NULL CHECK (target IN ('vm_slice', 'baremetal')),
    family                text NOT NULL,
    architecture          text NOT NULL,
    accelerator_vendor    text NOT NULL,
    accelerator_model     text,
    network_fabric        text NOT NULL,
    image_format          text NOT NULL,
    source_type           text NOT NULL,
    source_ref            text NOT NULL,
    digest_sha256         text CHECK (digest_sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes            bigint,
    cloud_init_supported  boolean NOT NULL,
    guest_agent_supported boolean NOT NULL,
    default_username      text NOT NULL,
    driver_strategy       text NOT NULL,
    compatible_skus       text[] NOT NULL DEFAULT '{}',
    active                boolean NOT NULL,
    present               boolean NOT NULL DEFAULT true,
    revision              text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    retired_at            timestamptz
);

CREATE TABLE nodes (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name               text NOT NULL UNIQUE,
    region             text NOT NULL,
    pool               text NOT NULL,
    hardware_tags      text[] NOT NULL DEFAULT '{}',
    profile_tags       text[] NOT NULL DEFAULT '{}',
    baremetal_sku      text,
    admin_state        text NOT NULL CHECK (admin_state IN ('active', 'draining', 'maintenance')),
    storage_mode       text NOT NULL CHECK (storage_mode IN ('slice', 'share')),
    os_disk            text NOT NULL,
    org                text,
    firmware_version   text,
    firmware_ready     boolean NOT NULL DEFAULT false,   -- onboarding evidence; host reports win
    capability         text NOT NULL CHECK (capability IN ('baremetal_only', 'slice_candidate', 'both_capable')),
    capability_reasons text[] NOT NULL DEFAULT '{}',
    management_network jsonb NOT NULL,                   -- resolved: node override or fleet default
    present            boolean NOT NULL DEFAULT true,
    revision           text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 85);  -- placements lock node rows (FOR SHARE / FOR UPDATE)

-- One approved slot bundle: GPU + per-slot VF + raw NVMe + NUMA + MAC/IP.
-- `status` is the slot's lifecycle; `present/enabled/approved/eligible` come
-- from git and policies.eligibility at the synced revision.
CREATE TABLE node_resource_slots (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id               uuid NOT NULL REFERENCES nodes (id),
    slot_index            integer NOT NULL CHECK (slot_index BETWEEN 0 AND 255),
    shape                 text NOT NULL DEFAULT 'gpu_slice',
    status                text NOT NULL DEFAULT 'available' CHECK (status IN (
                              'available', 'reserved', 'provisioning', 'active', 'releasing',
                              'cleanup', 'cleanup_blocked', 'failed', 'disabled')),
    gpu_model             text NOT NULL,
    gpu_count             integer NOT NULL DEFAULT 1,
    gpu_pci_address       text NOT NULL,
    gpu_uuid              text,
    numa_node             integer NOT NULL,
    slot_group            text NOT NULL,
    pcie_pair             text,
    nvme_device           text NOT NULL,
    network_fabric        text NOT NULL,
    fabric_vf_pci_address text,
    fabric_parent_device  text,
    fabric_claim_mode     text,
    mac_address           text NOT NULL,
    private_ip            inet NOT NULL,
    vcpu_count            integer,
    memory_mib            integer,
    sharing_model         text NOT NULL,
    max_claims            integer NOT NULL,
    parent_slot_id        text,
    compute_milli         integer NOT NULL,
    capacity_metadata     jsonb NOT NULL DEFAULT '{}',
    blockers              jsonb NOT NULL DEFAULT '[]',
    health_metadata       jsonb NOT NULL DEFAULT '{}',
    approved              boolean NOT NULL,
    enabled               boolean NOT NULL,
    eligible              boolean NOT NULL,
    ineligible_reasons    text[] NOT NULL DEFAULT '{}',
    present               boolean NOT NULL DEFAULT true,
    revision              text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    status_changed_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT slots_node_index UNIQUE (node_id, slot_index),
    -- Target of the claims' composite foreign key: a claim names a slot of its own node.
    CONSTRAINT slots_identity UNIQUE (id, node_id, slot_index)
) WITH (fillfactor = 85);  -- room for HOT updates: a claim changes status, never an indexed column

-- The customer-facing lease and billing anchor. Desired fields come from git;
-- status, placement and usage times are written by apply and cleanup only.
CREATE TABLE allocations (
    id                   text PRIMARY KEY,
    tenant               text NOT NULL,
    sku                  text NOT NULL,
    gpu_count            integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 8),
    region               text NOT NULL,
    image                text,
    ssh_keys             text[] NOT NULL DEFAULT '{}',
    vm_profile           text,
    desired_state        text NOT NULL CHECK (desired_state IN ('present', 'released')),
    requested_at         timestamptz NOT NULL,
    present              boolean NOT NULL DEFAULT true,
    status               text NOT NULL DEFAULT 'pending' CHECK (status IN (
                             'pending', 'reserved', 'provisioning', 'active', 'releasing',
                             'released', 'failed')),
    capacity_shape       text CHECK (capacity_shape IN ('baremetal', 'gpu_slice')),
    node_id              uuid REFERENCES nodes (id),
    placement            jsonb,
    placed_at            timestamptz,
    placed_revision      text,
    pending_code         text,
    pending_message      text,
    pending_details      jsonb,
    pending_since        timestamptz,
    active_at            timestamptz,
    release_requested_at timestamptz,
    released_at          timestamptz,
    revision             text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    status_changed_at    timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 85);  -- placement updates stay HOT (no index on status, on purpose)
