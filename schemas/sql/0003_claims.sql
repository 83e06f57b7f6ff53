-- Claims: the durable binding of an allocation to a whole node or to slots.
--
-- The database, not Python, makes a double sale impossible:
--   * claims_one_live_per_slot: at most one live claim per slot (partial unique index);
--   * claims_node_exclusive: a node_exclusive claim overlaps every slot of its node,
--     a slot claim only its own slot, and live claims on one node may not overlap
--     (exclusion constraint: refuses both orders, under any concurrency);
--   * claims_guard_insert: a new claim needs a pending allocation, a present and
--     active node, and an available, present, eligible slot (rows locked);
--   * claims_guard_update: claims are immutable except for their status, which
--     only moves forward, and leaves the live set only with cleanup proof;
--   * slots_guard_status: a slot cannot look free while a live claim holds it.
-- Errors carry the constraint name; reconciler.store.errors maps names to codes.

CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE allocation_resource_claims (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    allocation_id        text NOT NULL REFERENCES allocations (id),
    node_id              uuid NOT NULL REFERENCES nodes (id),
    slot_id              uuid,
    slot_index           integer,
    claim_kind           text NOT NULL CHECK (claim_kind IN ('node_exclusive', 'slot')),
    status               text NOT NULL DEFAULT 'reserved' CHECK (status IN (
                             'reserved', 'provisioning', 'active', 'releasing', 'released', 'failed')),
    resource_snapshot    jsonb NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    status_changed_at    timestamptz NOT NULL DEFAULT now(),
    provisioning_at      timestamptz,
    active_at            timestamptz,   -- usage starts
    release_requested_at timestamptz,   -- usage stops
    released_at          timestamptz,   -- cleanup proven, resources back in service
    failed_at            timestamptz,
    -- The part of the node this claim holds: a slot, or every slot (node_exclusive).
    claim_span           int4range GENERATED ALWAYS AS (
                             CASE WHEN slot_index IS NULL THEN int4range(0, 1024)
                                  ELSE int4range(slot_index, slot_index + 1) END) STORED,
    CONSTRAINT claims_kind_shape CHECK (
        (claim_kind = 'slot' AND slot_id IS NOT NULL AND slot_index IS NOT NULL)
        OR (claim_kind = 'node_exclusive' AND slot_id IS NULL AND slot_index IS NULL)),
    CONSTRAINT claims_slot_of_node FOREIGN KEY (slot_id, node_id, slot_index)
        REFERENCES node_resource_slots (id, node_id, slot_index)
);

CREATE UNIQUE INDEX claims_one_live_per_slot ON allocation_resource_claims (slot_id)
    WHERE slot_id IS NOT NULL AND status IN ('reserved', 'provisioning', 'active', 'releasing');

ALTER TABLE allocation_resource_claims ADD CONSTRAINT claims_node_exclusive
    EXCLUDE USING gist (node_id WITH =, claim_span WITH &&)
    WHERE (status IN ('reserved', 'provisioning', 'active', 'releasing'));

CREATE INDEX claims_allocation ON allocation_resource_claims (allocation_id);
-- "live claims on node X" is answered by the exclusion constraint's gist index.

-- Transactional outbox: written in the same transaction as the change it announces.
CREATE TABLE outbox (
    id             bigserial PRIMARY KEY,
    event_type     text NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id   text NOT NULL,
    payload        jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_aggregate ON outbox (aggregate_id, event_type);


-- Cleanup proof for one claim: verified wipe evidence for this allocation on
-- this slot's approved disk (slot claims), or verified node cleanup/reimage
-- (node_exclusive), reported after the release was requested.
CREATE FUNCTION claim_cleanup_proven(c allocation_resource_claims) RETURNS boolean
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
    END
$$;

CREATE FUNCTION claim_cleanup_failed(c allocation_resource_claims) RETURNS boolean
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
    END
$$;


CREATE FUNCTION claims_guard_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NEW.status NOT IN ('reserved', 'provisioning', 'active', 'releasing') THEN
        RAISE EXCEPTION 'a claim is created live, not %', NEW.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_created_live';
    END IF;
    -- The allocation row is the serialisation point (one placement per allocation);
    -- the node row is locked FOR UPDATE by a node_exclusive claim and FOR SHARE by a
    -- slot claim, so the two kinds also queue behind each other on the node.
    IF NEW.claim_kind = 'slot' THEN
        SELECT a.status AS a_status, n.name, n.present AS n_present, n.admin_state,
               s.status AS s_status, s.present AS s_present, s.eligible, s.ineligible_reasons
        INTO r
        FROM allocations a, nodes n, node_resource_slots s
        WHERE a.id = NEW.allocation_id AND n.id = NEW.node_id AND s.id = NEW.slot_id
        FOR UPDATE OF a, s FOR SHARE OF n;
    ELSE
        SELECT a.status AS a_status, n.name, n.present AS n_present, n.admin_state,
               NULL::text AS s_status, NULL::boolean AS s_present, NULL::boolean AS eligible,
               NULL::text[] AS ineligible_reasons
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
                 AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
        RAISE EXCEPTION 'allocation % already holds claims on another node', NEW.allocation_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_allocation_one_node';
    END IF;
    NEW.status_changed_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER claims_guard_insert BEFORE INSERT ON allocation_resource_claims
    FOR EACH ROW EXECUTE FUNCTION claims_guard_insert();


CREATE FUNCTION claims_guard_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.allocation_id <> OLD.allocation_id OR NEW.node_id <> OLD.node_id
       OR NEW.slot_id IS DISTINCT FROM OLD.slot_id OR NEW.slot_index IS DISTINCT FROM OLD.slot_index
       OR NEW.claim_kind <> OLD.claim_kind OR NEW.resource_snapshot <> OLD.resource_snapshot
       OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'claim % is immutable except for its status', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_immutable';
    END IF;
    IF NEW.status = OLD.status THEN
        RETURN NEW;
    END IF;
    IF NOT (
        (OLD.status = 'reserved' AND NEW.status IN ('provisioning', 'active', 'releasing'))
        OR (OLD.status = 'provisioning' AND NEW.status IN ('active', 'releasing'))
        OR (OLD.status = 'active' AND NEW.status = 'releasing')
        OR (OLD.status = 'releasing' AND NEW.status IN ('released', 'failed'))
    ) THEN
        RAISE EXCEPTION 'claim % cannot move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_status_transition';
    END IF;
    NEW.status_changed_at := now();
    CASE NEW.status
        WHEN 'provisioning' THEN NEW.provisioning_at := coalesce(NEW.provisioning_at, now());
        WHEN 'active' THEN NEW.active_at := coalesce(NEW.active_at, now());
        WHEN 'releasing' THEN NEW.release_requested_at := coalesce(NEW.release_requested_at, now());
        WHEN 'released' THEN NEW.released_at := coalesce(NEW.released_at, now());
        WHEN 'failed' THEN NEW.failed_at := coalesce(NEW.failed_at, now());
        ELSE NULL;
    END CASE;
    IF NEW.status IN ('released', 'failed') AND NOT claim_cleanup_proven(NEW) THEN
        RAISE EXCEPTION 'claim % on %:% leaves the live set only with verified cleanup proof',
                OLD.id, OLD.node_id, OLD.slot_index
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_release_needs_proof';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER claims_guard_update BEFORE UPDATE ON allocation_resource_claims
    FOR EACH ROW EXECUTE FUNCTION claims_guard_update();


CREATE FUNCTION claims_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'claims are billing and audit history: release them, never delete them'
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'claims_no_delete';
END
$$;

CREATE TRIGGER claims_no_delete BEFORE DELETE ON allocation_resource_claims
    FOR EACH ROW EXECUTE FUNCTION claims_no_delete();
CREATE TRIGGER claims_no_truncate BEFORE TRUNCATE ON allocation_resource_claims
    FOR EACH STATEMENT EXECUTE FUNCTION claims_no_delete();


CREATE FUNCTION slots_guard_status() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    live boolean;
BEGIN
    IF NEW.status = OLD.status THEN
        RETURN NEW;
    END IF;
    NEW.status_changed_at := now();
    live := EXISTS (SELECT 1 FROM allocation_resource_claims c
                    WHERE c.slot_id = NEW.id
                      AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'));
    IF NEW.status IN ('available', 'disabled') AND live THEN
        RAISE EXCEPTION 'slot %:% still has a live claim; only cleanup proof frees it',
                NEW.node_id, NEW.slot_index
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slots_free_without_claim';
    END IF;
    IF NEW.status IN ('reserved', 'provisioning', 'active', 'releasing') AND NOT live THEN
        RAISE EXCEPTION 'slot %:% cannot be % without a live claim', NEW.node_id, NEW.slot_index, NEW.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slots_claimed_needs_claim';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER slots_guard_status BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW EXECUTE FUNCTION slots_guard_status();
