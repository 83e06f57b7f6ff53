-- A host's error report is checked whole (issue 26).
--
-- 0008 let an entry of host_status.errors omit `step` and `allocation_id`
-- (absent passed as "null or a string"), so a host could write
-- [{"code": "x", "message": "y"}] and the node page then failed on it. An
-- entry is what host_reconciler/statuses.py writes: a non-empty `code`, a
-- `message`, a `step`, and `allocation_id` present (null for a node-wide
-- step, else a string). Nothing stricter than the writer guarantees: a
-- refused report would keep the host's whole status out of the store. Rows that break the rule are
-- repaired first, as 0008 did: the report becomes one `host.report.invalid`
-- error (the node keeps showing that something is wrong) until the host
-- writes its next report.
CREATE OR REPLACE FUNCTION gpuaas_valid_step_errors(report jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, public AS $$
DECLARE
    e jsonb;
BEGIN
    IF report IS NULL OR jsonb_typeof(report) <> 'array' THEN
        RETURN false;
    END IF;
    IF jsonb_array_length(report) > 4096 OR octet_length(report::text) > 1048576 THEN
        RETURN false;
    END IF;
    FOR e IN SELECT value FROM jsonb_array_elements(report) LOOP
        IF jsonb_typeof(e) <> 'object' THEN
            RETURN false;
        END IF;
        IF jsonb_typeof(e -> 'code') IS DISTINCT FROM 'string'
           OR jsonb_typeof(e -> 'message') IS DISTINCT FROM 'string'
           OR jsonb_typeof(e -> 'step') IS DISTINCT FROM 'string'
           OR NOT e ? 'allocation_id' THEN
            RETURN false;
        END IF;
        IF length(e ->> 'code') NOT BETWEEN 1 AND 128
           OR length(e ->> 'message') > 4096 OR length(e ->> 'step') > 4096
           OR NOT gpuaas_report_text_ok(e -> 'allocation_id') THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- The CHECK names the function, so rows stored before are re-checked only when it is added again.
ALTER TABLE host_status DROP CONSTRAINT host_status_errors_shape;
UPDATE host_status SET errors = jsonb_build_array(jsonb_build_object(
        'code', 'host.report.invalid', 'step', 'report', 'allocation_id', NULL,
        'message', 'the stored error report was malformed and was replaced when the database was upgraded'))
    WHERE NOT gpuaas_valid_step_errors(errors);
ALTER TABLE host_status ADD CONSTRAINT host_status_errors_shape CHECK (gpuaas_valid_step_errors(errors));
