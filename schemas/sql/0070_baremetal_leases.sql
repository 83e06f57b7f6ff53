-- Baremetal leases through a machine provider (issue 30).
--
-- One row per node_exclusive claim that a machine provider (MAAS, Ironic)
-- deploys: written BEFORE the provider is asked anything, so a restarted or
-- second reconciler finds the request and adopts the deploy (or erase) in
-- flight instead of starting another. The provider, not a host agent, is the
-- source of a lease's state (a leased machine runs the tenant's OS), so:
--
--   * claim_cleanup_proven / claim_cleanup_failed also read the lease's erase
--     result: a verified erase after the release was requested frees the claim
--     through the one rule that frees anything (gpuaas_free_cleaned);
--   * gpuaas_absorb_leases moves the claim to provisioning/active (usage starts
--     at the lease's active_at: deployed AND answering on SSH);
--   * gpuaas_provision_failures also reports a failed deploy, so a failed
--     deploy is rescheduled by gpuaas_reschedule like a failed host provision;
--   * machine_quarantine keeps a machine whose deploy failed out of placement
--     (with the provider's message) until an operator clears it.
--
-- Phases: deploy_requested -> deploying -> active -> release_requested -> erasing -> erased
--                                     \-> deploy_failed -> release_requested ...    \-> erase_failed

CREATE TABLE baremetal_leases (
    claim_id             uuid PRIMARY KEY REFERENCES allocation_resource_claims (id),
    allocation_id        text NOT NULL,
    node_name            text NOT NULL REFERENCES nodes (name),
    provider             text NOT NULL,
    machine_id           text NOT NULL,
    phase                text NOT NULL CHECK (phase IN ('deploy_requested', 'deploying', 'active', 'deploy_failed',
                                                        'release_requested', 'erasing', 'erased', 'erase_failed')),
    wipe_policy          text NOT NULL CHECK (wipe_policy IN ('secure_erase', 'quick_erase')),
    deploy_requested_at  timestamptz NOT NULL DEFAULT now(),
    deploy_sent_at       timestamptz,
    deployed_at          timestamptz,
    active_at            timestamptz,
    failed_at            timestamptz,
    release_requested_at timestamptz,
    erase_sent_at        timestamptz,
    erased_at            timestamptz,
    deploy_requests      integer NOT NULL DEFAULT 0,  -- provider deploy calls made (never more than one)
    erase_requests       integer NOT NULL DEFAULT 0,  -- provider release+erase calls made (never more than one)
    adopted              integer NOT NULL DEFAULT 0,  -- times a reconciler found the request in flight and adopted it
    provider_state       text,
    provider_message     text,
    ssh_endpoint         text,
    wait_code            text,
    wait_message         text,
    waiting_since        timestamptz,
    erase_evidence       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(erase_evidence) = 'object'),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
-- A machine serves one unfinished lease at a time, whatever the Python does.
CREATE UNIQUE INDEX baremetal_leases_one_per_machine ON baremetal_leases (provider, machine_id)
    WHERE phase <> 'erased';
CREATE INDEX baremetal_leases_allocation ON baremetal_leases (allocation_id);

CREATE TABLE machine_quarantine (
    node_name      text PRIMARY KEY REFERENCES nodes (name),
    provider       text NOT NULL,
    machine_id     text NOT NULL,
    allocation_id  text NOT NULL,
    code           text NOT NULL,
    message        text NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now()
);

-- What the providers report that we did not ask for (a machine deployed that
-- no lease of ours deployed, a declared machine the provider does not know):
-- shown to operators, never adopted or released. Replaced on every scan.
CREATE TABLE machine_drift (
    provider    text NOT NULL,
    machine_id  text NOT NULL,
    node_name   text,
    code        text NOT NULL,
    message     text NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, machine_id, code)
);

-- A slice host profile is owed to a slice-tagged node after a lease wrote the
-- tenant's OS over it: slices wait until its host agent reports after the erase.
CREATE TABLE node_profile_debts (
    node_name     text PRIMARY KEY REFERENCES nodes (name),
    allocation_id text NOT NULL,
    since         timestamptz NOT NULL DEFAULT now()
);


CREATE OR REPLACE FUNCTION claim_cleanup_proven(c allocation_resource_claims) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN c.claim_kind = 'slot' THEN EXISTS (
        SELECT 1 FROM host_slot_status h JOIN nodes n ON n.name = h.node_name
        WHERE n.id = c.node_id AND h.slot_index = c.slot_index
          AND h.wipe_allocation_id = c.allocation_id
          AND h.wipe_state = 'verified'
          AND h.wipe_reported_at >= c.release_requested_at
          AND h.wipe_evidence ->> 'device' = c.resource_snapshot -> 'slot' ->> 'nvme_device'
          AND (h.wipe_evidence ->> 'signature_clear') = 'true'
          AND (h.wipe_evidence ->> 'sampled_zero') = 'true')
    ELSE EXISTS (
        SELECT 1 FROM host_status h JOIN nodes n ON n.name = h.node_name
        WHERE n.id = c.node_id
          AND h.cleanup_allocation_id = c.allocation_id
          AND h.cleanup_state = 'verified'
          AND h.cleanup_reported_at >= c.release_requested_at)
      OR EXISTS (
        SELECT 1 FROM baremetal_leases bl
        WHERE bl.claim_id = c.id AND bl.phase = 'erased'
          AND bl.erased_at >= c.release_requested_at
          AND (bl.erase_evidence ->> 'verified') = 'true')
    END
$$;

CREATE OR REPLACE FUNCTION claim_cleanup_failed(c allocation_resource_claims) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN c.claim_kind = 'slot' THEN EXISTS (
        SELECT 1 FROM host_slot_status h JOIN nodes n ON n.name = h.node_name
        WHERE n.id = c.node_id AND h.slot_index = c.slot_index
          AND h.wipe_allocation_id = c.allocation_id
          AND h.wipe_state = 'failed'
          AND h.wipe_reported_at >= c.release_requested_at)
    ELSE EXISTS (
        SELECT 1 FROM host_status h JOIN nodes n ON n.name = h.node_name
        WHERE n.id = c.node_id
          AND h.cleanup_allocation_id = c.allocation_id
          AND h.cleanup_state = 'failed'
          AND h.cleanup_reported_at >= c.release_requested_at)
      OR EXISTS (SELECT 1 FROM baremetal_leases bl WHERE bl.claim_id = c.id AND bl.phase = 'erase_failed')
    END
$$;


-- Provider reports move node_exclusive claims forward, then allocations follow
-- their claims as in gpuaas_absorb_vm_states. Returns rows changed.
CREATE FUNCTION gpuaas_absorb_leases() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    changed integer := 0;
    k       integer;
BEGIN
    UPDATE allocation_resource_claims c SET
        status = CASE WHEN bl.phase = 'active' THEN 'active' ELSE 'provisioning' END,
        active_at = CASE WHEN bl.phase = 'active' THEN bl.active_at END
    FROM baremetal_leases bl
    WHERE bl.claim_id = c.id
      AND ((c.status = 'reserved' AND bl.phase IN ('deploying', 'active'))
           OR (c.status = 'provisioning' AND bl.phase = 'active'));
    GET DIAGNOSTICS k = ROW_COUNT;
    changed := changed + k;
    IF changed = 0 THEN
        RETURN 0;
    END IF;
    WITH agg AS (
        SELECT cl.allocation_id,
               bool_and(cl.status = 'active') AS all_active,
               bool_or(cl.status IN ('provisioning', 'active')) AS started,
               max(cl.active_at) AS active_at
        FROM allocation_resource_claims cl
        WHERE cl.status IN ('reserved', 'provisioning', 'active') AND cl.claim_kind = 'node_exclusive'
        GROUP BY cl.allocation_id
    )
    UPDATE allocations a SET
        status = CASE WHEN agg.all_active THEN 'active' ELSE 'provisioning' END,
        active_at = CASE WHEN agg.all_active THEN agg.active_at END,
        updated_at = now(), status_changed_at = now()
    FROM agg
    WHERE a.id = agg.allocation_id AND a.status IN ('reserved', 'provisioning')
      AND (agg.all_active OR (agg.started AND a.status = 'reserved'));
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN changed + k;
END
$$;


-- 0011's provision failures, plus a failed deploy a machine provider reported.
CREATE OR REPLACE FUNCTION gpuaas_provision_failures(p_patterns text[], p_allocation text DEFAULT NULL)
RETURNS TABLE (allocation_id text, node text, claim_kind text, slot_indexes integer[], phase text,
               code text, message text, host_reported_at timestamptz)
LANGUAGE sql STABLE AS $$
    WITH cur AS (
        SELECT a.id, a.node_id, n.name AS node, c.claim_kind::text AS claim_kind,
               array_agg(c.slot_index ORDER BY c.slot_index) FILTER (WHERE c.slot_index IS NOT NULL) AS slots
        FROM allocations a
        JOIN allocation_resource_claims c ON c.allocation_id = a.id
             AND c.status IN ('reserved', 'provisioning')
             AND NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)
        JOIN nodes n ON n.id = c.node_id
        WHERE a.status IN ('reserved', 'provisioning') AND a.desired_state = 'present' AND a.present
          AND (p_allocation IS NULL OR a.id = p_allocation)
        GROUP BY a.id, a.node_id, n.name, c.claim_kind
    ), rep AS (
        SELECT cur.*, h.reported_at, h.lease_allocation_id, h.lease_state,
               gpuaas_host_vm(h.details, cur.id) AS vm,
               (SELECT e FROM jsonb_array_elements(CASE WHEN jsonb_typeof(h.errors) = 'array'
                                                       THEN h.errors ELSE '[]'::jsonb END) e
                WHERE jsonb_typeof(e) = 'object' AND e ->> 'allocation_id' = cur.id LIMIT 1) AS err,
               EXISTS (SELECT 1 FROM host_slot_status hs
                       WHERE hs.node_name = cur.node AND hs.slot_index = ANY (cur.slots)
                         AND hs.allocation_id = cur.id AND hs.vm_state = 'failed') AS slot_failed
        FROM cur LEFT JOIN host_status h ON h.node_name = cur.node
    ), why AS (
        SELECT rep.*,
               CASE WHEN jsonb_typeof(vm -> 'error') = 'object' THEN vm -> 'error' ELSE err END AS e
        FROM rep
    )
    SELECT id, node, claim_kind, coalesce(slots, '{}'),
           coalesce(gpuaas_report_text(vm -> 'phase'), gpuaas_report_text(e -> 'step')),
           coalesce(gpuaas_report_text(e -> 'code'), 'host.provision.failed'),
           coalesce(gpuaas_report_text(e -> 'message'), 'the host reported the provision as failed'),
           reported_at
    FROM why
    WHERE slot_failed
       OR (claim_kind = 'node_exclusive' AND lease_allocation_id = id AND lease_state = 'failed')
       OR (gpuaas_report_text(vm -> 'state') = 'provisioning'
           AND gpuaas_report_text(e -> 'code') LIKE ANY (p_patterns))
    UNION ALL
    SELECT a.id, bl.node_name, 'node_exclusive', '{}'::integer[], 'deploy', 'baremetal.deploy.failed',
           left(format('%s machine %s: %s', bl.provider, bl.machine_id,
                       coalesce(nullif(bl.provider_message, ''), bl.provider_state, 'deploy failed')), 4096),
           bl.failed_at
    FROM baremetal_leases bl
    JOIN allocation_resource_claims c ON c.id = bl.claim_id AND c.status IN ('reserved', 'provisioning')
    JOIN allocations a ON a.id = c.allocation_id
    WHERE bl.phase = 'deploy_failed'
      AND NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)
      AND a.status IN ('reserved', 'provisioning') AND a.desired_state = 'present' AND a.present
      AND (p_allocation IS NULL OR a.id = p_allocation)
$$;
