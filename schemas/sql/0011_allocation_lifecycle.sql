-- One allocation lifecycle, fed by host reports; reschedule after a permanent
-- provision failure; host liveness (issue 15).
--
-- 1. Slots get a `quarantined` status and a `quarantine` evidence document.
--    A permanent provision failure that implicates the node (a GPU or VF not
--    on vfio-pci, an image digest mismatch, a disk guard refusal, a readiness
--    timeout) puts the evidence on the failed allocation's slots; cleanup still
--    runs (the claims are released through the host's wipe + verify), and the
--    cleanup proof that would make the slot `available` makes it
--    `quarantined` instead (trigger slots_keep_quarantine). Only an operator
--    clears it: `gpuaas slot clear NODE SLOT` (gpuaas_clear_quarantine), or a
--    commit that changes what the slot is (its approval, enablement, GPU, VF
--    or disk).
-- 2. allocation_attempts: one row per failed attempt (node, slots, phase, code,
--    message, evidence), the reason chain of the allocation. retired_claims:
--    the claims of a failed attempt. They keep releasing through cleanup
--    while the allocation, pending again, is placed elsewhere, so the
--    one-node guard and the invariants leave them out; the insert guard
--    refuses a claim on a node where the allocation failed before.
-- 3. gpuaas_reschedule(allocation, max_attempts, patterns): one transaction
--    per failed attempt: record the attempt, retire and release its claims,
--    quarantine its slots (when the code matches `patterns`), and make the
--    allocation pending again, or `failed` after max_attempts attempts (or at
--    once when the code does not implicate the node, e.g. a bad SSH key).
-- 4. node_liveness: a node whose host has reported is `unavailable` when its
--    last report is older than fleet_settings.host_liveness_ttl_s.
-- 5. allocation_lifecycle: pending -> reserved -> provisioning (host phase)
--    -> ready -> releasing -> cleanup -> released, or failed; with the host
--    phase, boot IP, attempt count, host_unreachable and the failure.

ALTER DOMAIN gpuaas_slot_status DROP CONSTRAINT gpuaas_slot_status_check;
ALTER DOMAIN gpuaas_slot_status ADD CONSTRAINT gpuaas_slot_status_check
    CHECK (VALUE IN ('available', 'reserved', 'provisioning', 'active', 'releasing',
                     'cleanup', 'cleanup_blocked', 'failed', 'disabled', 'quarantined'));

-- A domain, not a table CHECK: checked only when the column is assigned (see 0006).
CREATE DOMAIN gpuaas_quarantine AS jsonb
    CHECK (VALUE IS NULL OR jsonb_typeof(VALUE) = 'object');
ALTER TABLE node_resource_slots ADD COLUMN quarantine gpuaas_quarantine;

ALTER TABLE fleet_settings
    ADD COLUMN host_liveness_ttl_s integer NOT NULL DEFAULT 90
        CONSTRAINT fleet_liveness_ttl CHECK (host_liveness_ttl_s BETWEEN 5 AND 86400),
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 3
        CONSTRAINT fleet_max_attempts CHECK (max_attempts BETWEEN 1 AND 20);

ALTER TABLE allocations
    ADD COLUMN failure_code text,
    ADD COLUMN failure_message text,
    ADD COLUMN failed_at timestamptz;

CREATE TABLE allocation_attempts (
    allocation_id    text NOT NULL REFERENCES allocations (id),
    attempt          integer NOT NULL CHECK (attempt >= 1),
    node             text NOT NULL,
    claim_kind       text NOT NULL,
    slot_indexes     integer[] NOT NULL DEFAULT '{}',
    phase            text,
    code             text NOT NULL,
    message          text NOT NULL,
    quarantined      boolean NOT NULL,
    outcome          text NOT NULL CHECK (outcome IN ('rescheduled', 'failed')),
    evidence         jsonb NOT NULL DEFAULT '{}',
    placed_at        timestamptz,
    host_reported_at timestamptz,
    failed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (allocation_id, attempt)
);

CREATE TABLE retired_claims (
    claim_id      uuid PRIMARY KEY REFERENCES allocation_resource_claims (id),
    allocation_id text NOT NULL,
    attempt       integer NOT NULL,
    FOREIGN KEY (allocation_id, attempt) REFERENCES allocation_attempts (allocation_id, attempt)
);


-- The insert guard of 0007, with two changes: the claims of a failed attempt
-- (retired_claims, still releasing on the failed node) do not tie the
-- allocation to that node, and a claim on a node where the allocation
-- already failed is refused (claims_not_on_failed_node).
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


-- Quarantine outlives cleanup: the proof that frees a slot makes it quarantined.
-- Fires after slots_guard_status (name order), so the guard has checked the
-- free status already; a quarantined slot never holds a live claim.
CREATE FUNCTION slots_keep_quarantine() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A commit that changes what the slot is clears the quarantine (an operator's decision).
    IF OLD.quarantine IS NOT NULL AND NEW.quarantine IS NOT DISTINCT FROM OLD.quarantine
       AND (NEW.approved, NEW.enabled, NEW.gpu_pci_address, NEW.fabric_vf_pci_address, NEW.nvme_device,
            NEW.nvme_identity::text)
           IS DISTINCT FROM
           (OLD.approved, OLD.enabled, OLD.gpu_pci_address, OLD.fabric_vf_pci_address, OLD.nvme_device,
            OLD.nvme_identity::text) THEN
        NEW.quarantine := NULL;
    END IF;
    IF NEW.quarantine IS NOT NULL AND NEW.status = 'available' THEN
        NEW.status := 'quarantined';
        NEW.status_changed_at := now();
    ELSIF NEW.quarantine IS NULL AND NEW.status = 'quarantined' THEN
        NEW.status := CASE WHEN NEW.present AND NEW.enabled THEN 'available' ELSE 'disabled' END;
        NEW.status_changed_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER slots_keep_quarantine BEFORE UPDATE ON node_resource_slots
    FOR EACH ROW WHEN (OLD.quarantine IS NOT NULL OR NEW.quarantine IS NOT NULL)
    EXECUTE FUNCTION slots_keep_quarantine();


-- Liveness: a node whose host reported once is unavailable when silent longer than the TTL.
CREATE VIEW node_liveness AS
SELECT n.name AS node_name, h.reported_at, f.ttl AS ttl_s,
       CASE WHEN h.node_name IS NULL THEN NULL
            ELSE round(extract(epoch FROM now() - h.reported_at)::numeric, 1) END AS silent_s,
       CASE WHEN h.node_name IS NULL THEN 'unknown'
            WHEN h.reported_at < now() - make_interval(secs => f.ttl) THEN 'unavailable'
            ELSE 'live' END AS liveness
FROM nodes n
LEFT JOIN host_status h ON h.node_name = n.name
CROSS JOIN (SELECT coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90) AS ttl) f
WHERE n.present;


-- What the host last said about one allocation's VM: its entry in host_status.details.vms
-- (read tolerantly: a host report is untrusted input, see 0008).
CREATE FUNCTION gpuaas_host_vm(details jsonb, p_allocation text) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT v FROM jsonb_array_elements(CASE WHEN jsonb_typeof(details -> 'vms') = 'array'
                                            THEN details -> 'vms' ELSE '[]'::jsonb END) v
    WHERE jsonb_typeof(v) = 'object' AND v ->> 'allocation_id' = p_allocation
    LIMIT 1
$$;

CREATE FUNCTION gpuaas_report_text(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(value) = 'string' THEN left(value #>> '{}', 4096) END
$$;


-- Provision failures the host reported for allocations still being provisioned:
-- a slot of the current attempt reported `failed`, a baremetal lease reported
-- `failed`, or a VM still provisioning whose error matches p_patterns (a
-- readiness timeout, which the host itself retries).
CREATE FUNCTION gpuaas_provision_failures(p_patterns text[], p_allocation text DEFAULT NULL)
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
$$;


-- One failed attempt, one transaction. Outcomes: rescheduled | failed | busy | unchanged.
CREATE FUNCTION gpuaas_reschedule(p_allocation text, p_max_attempts integer, p_patterns text[])
RETURNS TABLE (outcome text, node text, attempt integer, code text, message text)
LANGUAGE plpgsql AS $$
DECLARE
    a        record;
    f        record;
    n        integer;
    implicated boolean;
    again    boolean;
    evidence jsonb;
    chain    text;
    retired  uuid[];
BEGIN
    SELECT al.id, al.status, al.placed_at INTO a FROM allocations al WHERE al.id = p_allocation
        FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'busy', NULL::text, NULL::integer, NULL::text, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO f FROM gpuaas_provision_failures(p_patterns, p_allocation) LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unchanged', NULL::text, NULL::integer, NULL::text, NULL::text;
        RETURN;
    END IF;
    n := 1 + (SELECT count(*) FROM allocation_attempts t WHERE t.allocation_id = a.id);
    implicated := f.code LIKE ANY (p_patterns);
    again := implicated AND n < p_max_attempts;
    evidence := jsonb_build_object(
        'allocation_id', a.id, 'attempt', n, 'node', f.node, 'slot_indexes', to_jsonb(f.slot_indexes),
        'phase', f.phase, 'code', f.code, 'message', f.message,
        'host_reported_at', f.host_reported_at, 'quarantined_at', now());
    INSERT INTO allocation_attempts (allocation_id, attempt, node, claim_kind, slot_indexes, phase, code, message,
                                     quarantined, outcome, evidence, placed_at, host_reported_at)
    VALUES (a.id, n, f.node, f.claim_kind, f.slot_indexes, f.phase, f.code, f.message,
            implicated AND f.claim_kind = 'slot', CASE WHEN again THEN 'rescheduled' ELSE 'failed' END,
            evidence, a.placed_at, f.host_reported_at);

    WITH live AS (
        SELECT c.id FROM allocation_resource_claims c
        WHERE c.allocation_id = a.id AND c.status IN ('reserved', 'provisioning', 'active')
          AND NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)
        FOR UPDATE OF c
    ), ins AS (
        INSERT INTO retired_claims (claim_id, allocation_id, attempt)
        SELECT live.id, a.id, n FROM live
        RETURNING claim_id
    )
    SELECT array_agg(claim_id) INTO retired FROM ins;
    WITH rel AS (
        UPDATE allocation_resource_claims SET status = 'releasing'
        WHERE id = ANY (retired)
        RETURNING slot_id
    )
    UPDATE node_resource_slots s SET status = 'cleanup', updated_at = now(),
           quarantine = CASE WHEN implicated THEN evidence ELSE s.quarantine END
    FROM rel WHERE s.id = rel.slot_id;

    SELECT string_agg(format('attempt %s on %s: %s%s: %s', t.attempt, t.node, t.code,
                             coalesce(' in ' || t.phase, ''), t.message), '; ' ORDER BY t.attempt)
    INTO chain FROM allocation_attempts t WHERE t.allocation_id = a.id;
    IF again THEN
        UPDATE allocations SET status = 'pending', node_id = NULL, placement = NULL, placed_at = NULL,
               placed_revision = NULL, active_at = NULL,
               pending_code = 'lifecycle.rescheduling',
               pending_message = left(format('placing again, never on %s (%s of %s attempts failed): %s',
                                             f.node, n, p_max_attempts, chain), 4096),
               pending_details = jsonb_build_object('attempts', n, 'max_attempts', p_max_attempts,
                                                    'avoid', (SELECT jsonb_agg(DISTINCT t.node)
                                                              FROM allocation_attempts t
                                                              WHERE t.allocation_id = a.id)),
               pending_since = now(), updated_at = now(), status_changed_at = now()
        WHERE id = a.id;
    ELSE
        UPDATE allocations SET status = 'failed',
               failure_code = CASE WHEN implicated THEN 'lifecycle.attempts_exhausted'
                                   ELSE 'lifecycle.provision_failed' END,
               failure_message = left(CASE WHEN implicated
                                           THEN format('%s of %s attempts failed: %s', n, p_max_attempts, chain)
                                           ELSE format('the failure does not depend on the node: %s', chain)
                                      END, 4096),
               failed_at = now(), pending_code = NULL, pending_message = NULL, pending_details = NULL,
               pending_since = NULL, updated_at = now(), status_changed_at = now()
        WHERE id = a.id;
    END IF;
    INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)
    VALUES ('provisioning.failed', 'allocation', a.id, evidence || jsonb_build_object(
        'next', CASE WHEN again THEN 'reschedule' ELSE 'failed' END, 'quarantined', implicated,
        'claim_ids', to_jsonb(coalesce(retired, '{}'))));
    RETURN QUERY SELECT CASE WHEN again THEN 'rescheduled' ELSE 'failed' END, f.node, n, f.code, f.message;
END
$$;


-- An operator clears a slot's quarantine. Outcomes: cleared | not_quarantined | unknown.
CREATE FUNCTION gpuaas_clear_quarantine(p_node text, p_slot integer)
RETURNS TABLE (outcome text, status text, evidence jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    s record;
BEGIN
    SELECT sl.id, sl.quarantine INTO s FROM node_resource_slots sl JOIN nodes n ON n.id = sl.node_id
    WHERE n.name = p_node AND sl.slot_index = p_slot FOR UPDATE OF sl;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown', NULL::text, NULL::jsonb;
        RETURN;
    END IF;
    IF s.quarantine IS NULL THEN
        RETURN QUERY SELECT 'not_quarantined', (SELECT sl.status::text FROM node_resource_slots sl WHERE sl.id = s.id),
                            NULL::jsonb;
        RETURN;
    END IF;
    UPDATE node_resource_slots SET quarantine = NULL, updated_at = now() WHERE id = s.id;
    INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)
    VALUES ('slot.quarantine_cleared', 'slot', p_node || ':' || p_slot,
            jsonb_build_object('node', p_node, 'slot_index', p_slot, 'evidence', s.quarantine));
    RETURN QUERY SELECT 'cleared', (SELECT sl.status::text FROM node_resource_slots sl WHERE sl.id = s.id),
                        s.quarantine::jsonb;
END
$$;


-- The lifecycle of every allocation, in one place.
CREATE VIEW allocation_lifecycle AS
SELECT a.id AS allocation_id, a.status::text AS status,
       CASE a.status
           WHEN 'active' THEN 'ready'
           WHEN 'releasing' THEN CASE WHEN rel.cleaning THEN 'cleanup' ELSE 'releasing' END
           ELSE a.status::text END AS state,
       n.name AS node,
       CASE WHEN a.status IN ('reserved', 'provisioning') THEN gpuaas_report_text(vm.v -> 'phase') END AS host_phase,
       gpuaas_report_text(vm.v -> 'state') AS host_vm_state,
       boot.private_ip AS boot_ip, boot.mac_address AS boot_mac,
       coalesce(att.n, 0) AS failed_attempts,
       att.nodes AS failed_nodes,
       (a.status IN ('reserved', 'provisioning', 'active', 'releasing') AND l.liveness = 'unavailable')
           AS host_unreachable,
       l.reported_at AS host_reported_at,
       a.failure_code, a.failure_message, a.failed_at,
       a.pending_code, a.pending_message
FROM allocations a
LEFT JOIN nodes n ON n.id = a.node_id
LEFT JOIN node_liveness l ON l.node_name = n.name
LEFT JOIN host_status h ON h.node_name = n.name
LEFT JOIN LATERAL (SELECT gpuaas_host_vm(h.details, a.id) AS v) vm ON true
LEFT JOIN LATERAL (
    SELECT c.resource_snapshot -> 'slot' ->> 'private_ip' AS private_ip,
           c.resource_snapshot -> 'slot' ->> 'mac_address' AS mac_address
    FROM allocation_resource_claims c
    WHERE c.allocation_id = a.id AND c.node_id = a.node_id AND c.claim_kind = 'slot'
      AND NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)
    ORDER BY c.slot_index LIMIT 1) boot ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n, array_agg(t.node ORDER BY t.attempt) AS nodes
    FROM allocation_attempts t WHERE t.allocation_id = a.id) att ON true
LEFT JOIN LATERAL (
    -- cleanup: the host has taken the VM down on every releasing slot (or reports the node cleanup)
    SELECT (count(*) > 0 AND bool_and(hs.vm_state IS NOT DISTINCT FROM 'absent'))
           OR (h.cleanup_allocation_id IS NOT DISTINCT FROM a.id) AS cleaning
    FROM allocation_resource_claims c
    LEFT JOIN host_slot_status hs ON hs.node_name = n.name AND hs.slot_index = c.slot_index
         AND hs.allocation_id = a.id
    WHERE c.allocation_id = a.id AND c.node_id = a.node_id AND c.status = 'releasing') rel ON true;
