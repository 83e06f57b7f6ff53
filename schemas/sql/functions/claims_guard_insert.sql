-- Insert guard of allocation_resource_claims (trigger claims_guard_insert): a claim is
-- created live, on a pending allocation, a claimable node and slot, one node per allocation,
-- never on a node where the allocation failed before.
-- Defined by 0003, 0007 (every record field cast to one type) and 0011 (retired claims, failed nodes).
CREATE OR REPLACE FUNCTION claims_guard_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NEW.status NOT IN ('reserved', 'provisioning', 'active', 'releasing') THEN
        RAISE EXCEPTION 'a claim is created live, not %', NEW.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_created_live';
    END IF;
    IF NEW.claim_kind = 'slot' THEN
        SELECT a.status::text AS a_status, n.name::text AS name, n.present::boolean AS n_present,
               n.admin_state::text AS admin_state, s.status::text AS s_status, s.present::boolean AS s_present,
               s.eligible::boolean AS eligible, s.ineligible_reasons::text[] AS ineligible_reasons
        INTO r
        FROM allocations a, nodes n, node_resource_slots s
        WHERE a.id = NEW.allocation_id AND n.id = NEW.node_id AND s.id = NEW.slot_id
        FOR UPDATE OF a, s FOR SHARE OF n;
    ELSE
        SELECT a.status::text AS a_status, n.name::text AS name, n.present::boolean AS n_present,
               n.admin_state::text AS admin_state, NULL::text AS s_status, NULL::boolean AS s_present,
               NULL::boolean AS eligible, NULL::text[] AS ineligible_reasons
        INTO r
        FROM allocations a, nodes n
        WHERE a.id = NEW.allocation_id AND n.id = NEW.node_id
        FOR UPDATE OF a, n;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'claim names an unknown allocation, node or slot'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'claims_references';
    END IF;
    IF r.a_status <> 'pending' THEN
        RAISE EXCEPTION 'allocation % is %, not pending: it takes no new claims', NEW.allocation_id, r.a_status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_allocation_pending';
    END IF;
    IF NOT r.n_present OR r.admin_state <> 'active' THEN
        RAISE EXCEPTION 'node % takes no new claims (present=%, admin_state=%)', r.name, r.n_present, r.admin_state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_node_claimable';
    END IF;
    IF NEW.claim_kind = 'slot' AND (r.s_status <> 'available' OR NOT r.s_present OR NOT r.eligible) THEN
        RAISE EXCEPTION 'slot %:% is not claimable (status=%, present=%, eligible=%, reasons=%)',
                r.name, NEW.slot_index, r.s_status, r.s_present, r.eligible, r.ineligible_reasons
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_slot_claimable';
    END IF;
    IF EXISTS (SELECT 1 FROM allocation_resource_claims c
               WHERE c.allocation_id = NEW.allocation_id AND c.node_id <> NEW.node_id
                 AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
                 AND NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)) THEN
        RAISE EXCEPTION 'allocation % already holds claims on another node', NEW.allocation_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_allocation_one_node';
    END IF;
    IF EXISTS (SELECT 1 FROM allocation_attempts t
               WHERE t.allocation_id = NEW.allocation_id AND t.node = r.name) THEN
        RAISE EXCEPTION 'allocation % failed on node % before: it is never placed there again',
                NEW.allocation_id, r.name
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_not_on_failed_node';
    END IF;
    NEW.status_changed_at := now();
    RETURN NEW;
END
$$;
ALTER FUNCTION claims_guard_insert() COST 100;
