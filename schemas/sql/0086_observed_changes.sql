-- What the planner observes, kept between revisions ([perf2]).
--
-- `reconciler/store/live.observe` used to re-read every live claim (four
-- joins), every host report, every placed allocation, image cache and failed
-- attempt on every commit. The loop now keeps its last `Observed` and
-- re-reads only the allocations and nodes named here since its watermark.
--
-- observed_changes: one row per (transaction, allocation or node) whose
-- observed facts a statement changed, written by statement-level triggers
-- from the transition tables (a bulk write costs one INSERT ... SELECT, not
-- one call per row). `xid` is the writing transaction: a reader keeps the
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

-- TG_ARGV: kind, key column, then the columns whose change matters on UPDATE
-- (an update of other columns, such as a host report's heartbeat, logs nothing).
CREATE FUNCTION observed_log() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    watched text := '';
    i int;
BEGIN
    IF TG_OP = 'INSERT' THEN
        EXECUTE format('INSERT INTO public.observed_changes (kind, key) SELECT DISTINCT %L, %I FROM new_rows',
                       TG_ARGV[0], TG_ARGV[1]);
    ELSIF TG_OP = 'DELETE' THEN
        EXECUTE format('INSERT INTO public.observed_changes (kind, key) SELECT DISTINCT %L, %I FROM old_rows',
                       TG_ARGV[0], TG_ARGV[1]);
    ELSE
        FOR i IN 2 .. TG_NARGS - 1 LOOP
            watched := watched || format(', %I', TG_ARGV[i]);
        END LOOP;
        EXECUTE format('INSERT INTO public.observed_changes (kind, key) SELECT DISTINCT %L, k FROM ('
                       'SELECT %I AS k%s FROM new_rows EXCEPT SELECT %I%s FROM old_rows) d',
                       TG_ARGV[0], TG_ARGV[1], watched, TG_ARGV[1], watched);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION observed_log() FROM PUBLIC;

CREATE FUNCTION observed_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    UPDATE public.observed_horizon SET xid = pg_current_xact_id();
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION observed_truncated() FROM PUBLIC;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM (VALUES
        ('allocations', 'a', 'id', 'status, tenant'),
        ('allocation_resource_claims', 'a', 'allocation_id', 'status, node_id, slot_index, claim_kind'),
        ('retired_claims', 'a', 'allocation_id', 'claim_id, attempt'),
        ('allocation_attempts', 'a', 'allocation_id', 'attempt, node'),
        ('host_status', 'n', 'node_name', 'healthy, firmware_ready, drift'),
        ('host_slot_status', 'n', 'node_name', 'slot_index, drift, wipe_state'),
        ('node_image_cache', 'n', 'node_name', 'digest_sha256'),
        ('machine_quarantine', 'n', 'node_name', 'node_name'),
        ('node_profile_debts', 'n', 'node_name', 'node_name')
    ) AS v (tbl, kind, keycol, watched) LOOP
        EXECUTE format('CREATE TRIGGER observed_insert AFTER INSERT ON %I REFERENCING NEW TABLE AS new_rows'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION observed_log(%L, %L)', t.tbl, t.kind, t.keycol);
        EXECUTE format('CREATE TRIGGER observed_delete AFTER DELETE ON %I REFERENCING OLD TABLE AS old_rows'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION observed_log(%L, %L)', t.tbl, t.kind, t.keycol);
        EXECUTE format('CREATE TRIGGER observed_update AFTER UPDATE ON %I'
                       ' REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION observed_log(%L, %L, %s)',
                       t.tbl, t.kind, t.keycol,
                       (SELECT string_agg(quote_literal(trim(c)), ', ') FROM unnest(string_to_array(t.watched, ',')) c));
        EXECUTE format('CREATE TRIGGER observed_truncate AFTER TRUNCATE ON %I'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION observed_truncated()', t.tbl);
    END LOOP;
END
$$;
