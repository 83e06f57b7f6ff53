-- Cleanup proof for one claim: verified wipe evidence for this allocation on this slot's
-- approved disk (slot claims), or verified node cleanup/reimage or a verified provider erase
-- (node_exclusive), reported after the release was requested.
-- Defined by 0003; 0070 added the provider erase.
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
