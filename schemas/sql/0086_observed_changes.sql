-- What the planner observes, kept between revisions ([perf2]).
--
-- `reconciler/store/live.observe` used to re-read every live claim (four
-- joins), every host report, every placed allocation, image cache and failed
-- attempt on every commit. The loop now keeps its last `Observed` and
-- re-reads only the allocations and nodes named here since its watermark.
--
-- observed_changes: one row per allocation or node whose observed facts a
-- statement changed (triggers below; an update logs only when a column the
-- planner reads changed, so a host's heartbeat logs nothing). `xid` is the writing transaction: a reader keeps the
-- xmin of the snapshot it read under as its watermark and next reads every
-- row with xid >= it, so a transaction still open at the read (whose changes
-- it could not see) is read next time, whatever order transactions commit in.
--
-- observed_horizon: the newest xid of rows pruned (and of any TRUNCATE of a
-- watched table). A reader whose watermark is not above it reads everything
-- again; so does a reader whose watermark is above the server's current
-- snapshot (another cluster, a restore).

CREATE TABLE observed_changes (
    xid  xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind "char" NOT NULL CHECK (kind IN ('a', 'n')),  -- a: allocation id, n: node name
    key  text NOT NULL,
    at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX observed_changes_xid ON observed_changes (xid);

CREATE TABLE observed_horizon (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    xid       xid8 NOT NULL DEFAULT '0'
);
INSERT INTO observed_horizon DEFAULT VALUES;

-- Statement level, for the tables the reconciler writes in bulk (allocations and
-- their claims: a cold apply inserts them by the thousand). TG_ARGV: kind, key column.
\ir functions/observed_log.sql
REVOKE ALL ON FUNCTION observed_log() FROM PUBLIC;

-- Row level, guarded by WHEN on UPDATE: the host tables take one upsert per report (a heartbeat
-- changes nothing the planner reads and must not pay for a transition table), and an update of
-- columns the planner does not read (the sync's revision stamps) calls nothing.
\ir functions/observed_row.sql
REVOKE ALL ON FUNCTION observed_row() FROM PUBLIC;

\ir functions/observed_truncated.sql
REVOKE ALL ON FUNCTION observed_truncated() FROM PUBLIC;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM (VALUES
        ('allocations', 'a', 'id', 'status, tenant', true),
        ('allocation_resource_claims', 'a', 'allocation_id', 'status, node_id, slot_index, claim_kind', true),
        ('retired_claims', 'a', 'allocation_id', 'claim_id, attempt', true),
        ('allocation_attempts', 'a', 'allocation_id', 'attempt, node', true),
        ('host_status', 'n', 'node_name', 'healthy, firmware_ready, drift', false),
        ('host_slot_status', 'n', 'node_name', 'slot_index, drift, wipe_state', false),
        ('node_image_cache', 'n', 'node_name', 'digest_sha256', false),
        ('machine_quarantine', 'n', 'node_name', 'node_name', false),
        ('node_profile_debts', 'n', 'node_name', 'node_name', false)
    ) AS v (tbl, kind, keycol, watched, bulk) LOOP
        IF t.bulk THEN
            EXECUTE format('CREATE TRIGGER observed_insert AFTER INSERT ON %I REFERENCING NEW TABLE AS new_rows'
                           ' FOR EACH STATEMENT EXECUTE FUNCTION observed_log(%L, %L)', t.tbl, t.kind, t.keycol);
            EXECUTE format('CREATE TRIGGER observed_delete AFTER DELETE ON %I REFERENCING OLD TABLE AS old_rows'
                           ' FOR EACH STATEMENT EXECUTE FUNCTION observed_log(%L, %L)', t.tbl, t.kind, t.keycol);
        ELSE
            EXECUTE format('CREATE TRIGGER observed_insert AFTER INSERT ON %I'
                           ' FOR EACH ROW EXECUTE FUNCTION observed_row(%L, %L)', t.tbl, t.kind, t.keycol);
            EXECUTE format('CREATE TRIGGER observed_delete AFTER DELETE ON %I'
                           ' FOR EACH ROW EXECUTE FUNCTION observed_row(%L, %L)', t.tbl, t.kind, t.keycol);
        END IF;
        EXECUTE format('CREATE TRIGGER observed_update AFTER UPDATE ON %I FOR EACH ROW'
                       ' WHEN ((%s) IS DISTINCT FROM (%s)) EXECUTE FUNCTION observed_row(%L, %L)',
                       t.tbl,
                       (SELECT string_agg('OLD.' || quote_ident(trim(c)), ', ') FROM unnest(string_to_array(t.watched, ',')) c),
                       (SELECT string_agg('NEW.' || quote_ident(trim(c)), ', ') FROM unnest(string_to_array(t.watched, ',')) c),
                       t.kind, t.keycol);
        EXECUTE format('CREATE TRIGGER observed_truncate AFTER TRUNCATE ON %I'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION observed_truncated()', t.tbl);
    END LOOP;
END
$$;
