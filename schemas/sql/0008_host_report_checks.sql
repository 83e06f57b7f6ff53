-- Host reports are untrusted input (issue 13).
--
-- A node role writes its own host_status and host_slot_status rows (0050), so
-- a compromised or buggy host can put any JSON there. The database refuses a
-- report of the wrong shape, so every reader (`gpuaas drift`, the service,
-- the cleanup proof in 0003) sees only reports of the shape
-- host_reconciler/store.py writes:
--
--   drift (node and slot): an array (at most 4096 entries) of objects with a
--     string `code` (`drift.` + dotted lower-case words, at most 128 chars) and
--     a string `message`; `slot_index` null or an integer 0-255;
--     allocation_id, expected, observed, heal, subject and state null or strings.
--   errors: an array (at most 4096) of objects with string `code` and `message`,
--     `step` and `allocation_id` null or strings.
--   phase_timings, details, wipe_evidence, cleanup_evidence: objects.
--   Every string in a report at most 4096 characters, every report at most
--   1 MiB as text; host-written text columns at most 4096 characters.
--
-- Readers stay tolerant anyway (host_reconciler/reports.py shows a malformed
-- report as `drift.report.invalid`): a row written before this migration, or
-- by the table owner, is not trusted either.
--
-- Existing rows must still migrate: a row that breaks a rule is repaired
-- first, its malformed drift replaced by one `drift.report.invalid` finding
-- (so the node shows as needing attention rather than clean), malformed
-- errors by one `host.report.invalid` error, a malformed object by '{}' (wipe
-- or cleanup evidence that is not an object never proved anything), and an
-- over-long text cut to 4096 characters. The host rewrites all of it on its
-- next pass.

-- A report field that is absent, null, or a string of at most 4096 characters.
CREATE FUNCTION gpuaas_report_text_ok(value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN value IS NULL OR jsonb_typeof(value) = 'null' THEN true
                WHEN jsonb_typeof(value) = 'string' THEN length(value #>> '{}') <= 4096
                ELSE false END
$$;

-- PL/pgSQL so the checks run in order: a cast or an array function never sees the wrong JSON type.
CREATE FUNCTION gpuaas_valid_drift(report jsonb) RETURNS boolean
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
           OR jsonb_typeof(e -> 'message') IS DISTINCT FROM 'string' THEN
            RETURN false;
        END IF;
        IF NOT (e ->> 'code') ~ '^drift(\.[a-z0-9_]+)+$' OR length(e ->> 'code') > 128
           OR length(e ->> 'message') > 4096 THEN
            RETURN false;
        END IF;
        IF jsonb_typeof(e -> 'slot_index') = 'number' THEN
            IF NOT (e ->> 'slot_index') ~ '^[0-9]{1,3}$' THEN
                RETURN false;
            END IF;
            IF (e ->> 'slot_index')::integer > 255 THEN
                RETURN false;
            END IF;
        ELSIF coalesce(jsonb_typeof(e -> 'slot_index'), 'null') <> 'null' THEN
            RETURN false;
        END IF;
        IF NOT (gpuaas_report_text_ok(e -> 'allocation_id') AND gpuaas_report_text_ok(e -> 'expected')
                AND gpuaas_report_text_ok(e -> 'observed') AND gpuaas_report_text_ok(e -> 'heal')
                AND gpuaas_report_text_ok(e -> 'subject') AND gpuaas_report_text_ok(e -> 'state')) THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

CREATE FUNCTION gpuaas_valid_step_errors(report jsonb) RETURNS boolean
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
           OR jsonb_typeof(e -> 'message') IS DISTINCT FROM 'string' THEN
            RETURN false;
        END IF;
        IF length(e ->> 'code') > 128 OR length(e ->> 'message') > 4096
           OR NOT (gpuaas_report_text_ok(e -> 'step') AND gpuaas_report_text_ok(e -> 'allocation_id')) THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

CREATE FUNCTION gpuaas_valid_report_object(report jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN report IS NULL OR jsonb_typeof(report) <> 'object' THEN false
                ELSE octet_length(report::text) <= 1048576 END
$$;

-- Repair what is already there (see the header), then refuse it from now on.
UPDATE host_status SET drift = jsonb_build_array(jsonb_build_object(
        'code', 'drift.report.invalid', 'slot_index', NULL, 'heal', NULL,
        'message', 'the stored drift report was malformed and was replaced when the database was upgraded'))
    WHERE NOT gpuaas_valid_drift(drift);
UPDATE host_slot_status SET drift = jsonb_build_array(jsonb_build_object(
        'code', 'drift.report.invalid', 'slot_index', slot_index, 'heal', NULL,
        'message', 'the stored drift report was malformed and was replaced when the database was upgraded'))
    WHERE NOT gpuaas_valid_drift(drift);
UPDATE host_status SET errors = jsonb_build_array(jsonb_build_object(
        'code', 'host.report.invalid', 'step', NULL, 'allocation_id', NULL,
        'message', 'the stored error report was malformed and was replaced when the database was upgraded'))
    WHERE NOT gpuaas_valid_step_errors(errors);
UPDATE host_status SET phase_timings = '{}' WHERE NOT gpuaas_valid_report_object(phase_timings);
UPDATE host_status SET details = '{}' WHERE NOT gpuaas_valid_report_object(details);
UPDATE host_status SET cleanup_evidence = '{}' WHERE NOT gpuaas_valid_report_object(cleanup_evidence);
UPDATE host_slot_status SET phase_timings = '{}' WHERE NOT gpuaas_valid_report_object(phase_timings);
UPDATE host_slot_status SET wipe_evidence = '{}' WHERE NOT gpuaas_valid_report_object(wipe_evidence);
UPDATE host_status SET lease_allocation_id = left(lease_allocation_id, 4096),
                       cleanup_allocation_id = left(cleanup_allocation_id, 4096)
    WHERE length(lease_allocation_id) > 4096 OR length(cleanup_allocation_id) > 4096;
UPDATE host_slot_status SET allocation_id = left(allocation_id, 4096),
                            wipe_allocation_id = left(wipe_allocation_id, 4096),
                            wipe_error = left(wipe_error, 4096)
    WHERE length(allocation_id) > 4096 OR length(wipe_allocation_id) > 4096 OR length(wipe_error) > 4096;

ALTER TABLE host_status
    ADD CONSTRAINT host_status_drift_shape CHECK (gpuaas_valid_drift(drift)),
    ADD CONSTRAINT host_status_errors_shape CHECK (gpuaas_valid_step_errors(errors)),
    ADD CONSTRAINT host_status_objects_shape CHECK (
        gpuaas_valid_report_object(phase_timings) AND gpuaas_valid_report_object(details)
        AND gpuaas_valid_report_object(cleanup_evidence)),
    ADD CONSTRAINT host_status_text_size CHECK (
        length(lease_allocation_id) <= 4096 AND length(cleanup_allocation_id) <= 4096);

ALTER TABLE host_slot_status
    ADD CONSTRAINT host_slot_status_drift_shape CHECK (gpuaas_valid_drift(drift)),
    ADD CONSTRAINT host_slot_status_objects_shape CHECK (
        gpuaas_valid_report_object(phase_timings) AND gpuaas_valid_report_object(wipe_evidence)),
    ADD CONSTRAINT host_slot_status_text_size CHECK (
        length(allocation_id) <= 4096 AND length(wipe_allocation_id) <= 4096 AND length(wipe_error) <= 4096);
