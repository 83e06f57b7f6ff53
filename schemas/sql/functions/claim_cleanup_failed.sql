-- A claim's cleanup failed: the host or the machine provider reported it after the release.
-- Defined by 0003; 0070 added the provider's erase_failed.
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
