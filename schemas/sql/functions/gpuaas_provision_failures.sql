-- Allocations whose provision failed: the host reported it (VM or lease), or a machine
-- provider reported a failed deploy.
-- Defined by 0011; 0070 added the provider's failed deploy.
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
