-- A host's error report, checked whole (CHECK host_status_errors_shape): entries as
-- host_reconciler/statuses.py writes them.
-- Defined by 0008; 0055 made step and allocation_id required.
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
