-- Host plans and host status: the contract between the central reconciler and
-- the host reconciler on every node ([host] issue).
--
-- The central reconciler writes one plan per node (`host_plans`, generation
-- bumped only when the spec changes; spec is host_reconciler.hostplans JSON).
-- The host reconciler reads only its node's plan and writes only its node's
-- status rows; row-level security per node role arrives in a later migration.
-- Keyed by node name, which is what a host knows itself as.

CREATE TABLE host_plans (
    node_name  text PRIMARY KEY REFERENCES nodes (name),
    generation bigint NOT NULL CHECK (generation >= 1),
    spec       jsonb NOT NULL,
    revision   text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Node-level report. `healthy = false` makes the planner treat the node as
-- unavailable; `firmware_ready` overrides the onboarding evidence in git.
-- Baremetal leases report through lease_* and their reimage proof through cleanup_*.
CREATE TABLE host_status (
    node_name           text PRIMARY KEY REFERENCES nodes (name),
    observed_generation bigint NOT NULL DEFAULT 0,
    reported_at         timestamptz NOT NULL DEFAULT now(),
    healthy             boolean,
    firmware_ready      boolean,
    lease_allocation_id text,
    lease_state         text CHECK (lease_state IN ('provisioning', 'ready', 'failed')),
    lease_ready_at      timestamptz,
    cleanup_allocation_id text,
    cleanup_state       text CHECK (cleanup_state IN ('running', 'verified', 'failed')),
    cleanup_evidence    jsonb NOT NULL DEFAULT '{}',
    cleanup_reported_at timestamptz,
    phase_timings       jsonb NOT NULL DEFAULT '{}',
    drift               jsonb NOT NULL DEFAULT '[]',
    errors              jsonb NOT NULL DEFAULT '[]',
    details             jsonb NOT NULL DEFAULT '{}'
);

-- Per-slot report. Wipe evidence frees a slot only when it is verified, names
-- the allocation whose release it proves, was reported after that release was
-- requested, and carries the checks the seeds require (see
-- claim_cleanup_proven in 0003): {"device": <by-id path of the claimed slot>,
-- "signature_clear": true (blkid -p finds nothing), "sampled_zero": true
-- (sampled blocks read back zero), ...anything else the host records}.
CREATE TABLE host_slot_status (
    node_name           text NOT NULL REFERENCES nodes (name),
    slot_index          integer NOT NULL,
    observed_generation bigint NOT NULL DEFAULT 0,
    allocation_id       text,              -- allocation whose VM the host sees on this slot
    vm_state            text NOT NULL DEFAULT 'unknown' CHECK (vm_state IN (
                            'unknown', 'absent', 'provisioning', 'ready', 'stopping', 'stopped', 'failed')),
    vm_ready_at         timestamptz,
    wipe_allocation_id  text,
    wipe_state          text CHECK (wipe_state IN ('running', 'verified', 'failed')),
    wipe_evidence       jsonb NOT NULL DEFAULT '{}',
    wipe_error          text,
    wipe_reported_at    timestamptz,
    phase_timings       jsonb NOT NULL DEFAULT '{}',
    drift               jsonb NOT NULL DEFAULT '[]',
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_name, slot_index)
);
