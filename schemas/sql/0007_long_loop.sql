-- A long-running reconciler must never wedge (issue 18).
--
-- 1. One session, every mix of claim kinds. PL/pgSQL caches one plan per
--    statement for the life of a session, typed by the values it saw first.
--    claims_guard_insert filled its record `r` from two queries: a slot claim
--    read s.status (domain gpuaas_slot_status since 0006), a node claim read
--    NULL::text. The IF that reads r.s_status was planned for whichever kind
--    came first, and the other kind then failed in that session with "type of
--    parameter N does not match that when preparing the plan" until the
--    connection closed: a baremetal lease followed by a slice wedged the loop.
--    Rule kept from here on: a record filled by more than one query gets every
--    field cast to one explicit base type in each query.
CREATE OR REPLACE FUNCTION claims_guard_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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
                 AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
        RAISE EXCEPTION 'allocation % already holds claims on another node', NEW.allocation_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_allocation_one_node';
    END IF;
    NEW.status_changed_at := now();
    RETURN NEW;
END
$$;

-- 2. History without ghosts. A reconciliation records the backend that runs
--    it; a row still 'running' whose backend is gone (the process was killed,
--    its connection dropped) is marked 'abandoned' by the next reader or
--    writer of the history (gpuaas_sweep_abandoned). Another role's session
--    may hide its backend_start: then the pid alone counts as alive (a ghost
--    may stay until that pid is gone; a live run is never called abandoned).
CREATE FUNCTION gpuaas_backend_start() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
$$;

ALTER TABLE reconciliations
    ADD COLUMN backend_pid integer,
    ADD COLUMN backend_start timestamptz,
    DROP CONSTRAINT reconciliations_result_check,
    ADD CONSTRAINT reconciliations_result_check
        CHECK (result IN ('running', 'changed', 'unchanged', 'error', 'abandoned'));
ALTER TABLE reconciliations ALTER COLUMN backend_pid SET DEFAULT pg_backend_pid();
ALTER TABLE reconciliations ALTER COLUMN backend_start SET DEFAULT gpuaas_backend_start();
CREATE INDEX reconciliations_running ON reconciliations (id) WHERE result = 'running';

CREATE FUNCTION gpuaas_sweep_abandoned() RETURNS integer LANGUAGE sql AS $$
    WITH gone AS (
        UPDATE reconciliations r
        SET result = 'abandoned', finished_at = clock_timestamp(),
            errors = errors || jsonb_build_array(jsonb_build_object(
                'code', 'gitops.reconciliation_abandoned',
                'message', format('the reconciler %s stopped before it finished this reconciliation',
                                  r.reconciler)))
        WHERE r.result = 'running'
          AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                          WHERE a.pid = r.backend_pid
                            AND (a.backend_start IS NULL OR a.backend_start = r.backend_start))
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;

-- Readers (history, status, the service's read-only transactions) see the
-- same verdict without writing: a running row whose backend is gone reads
-- as abandoned.
CREATE VIEW reconciliation_history AS
SELECT r.id, r.revision, r.source, r.reconciler, r.started_at, r.finished_at,
       CASE WHEN r.result = 'running' AND NOT EXISTS (
                SELECT 1 FROM pg_stat_activity a
                WHERE a.pid = r.backend_pid AND (a.backend_start IS NULL OR a.backend_start = r.backend_start))
            THEN 'abandoned' ELSE r.result END AS result,
       r.counts, r.errors
FROM reconciliations r;
