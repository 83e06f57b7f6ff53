-- gpuaas_place_batch: the one placing path (claims.place and place_many call it,
-- production and the fault-injection tests alike). Placement i is
-- p_allocations[i] (claim kind, profile and image alike), with candidates
-- p_counts[i] consecutive entries of p_nodes / p_slots (p_slots holds int[]
-- literals such as '{0,1}'). Every attempt is its own transaction. Out: one
-- entry per attempt made, in order: the placement (1-based), its candidate
-- (1-based), the outcome and detail, the claim ids. A placement stops at
-- 'placed', 'busy', 'not_pending' or 'unknown', or when its candidates run
-- out. A refusal raised by the database (outcome 'error', detail the message,
-- plus r_sqlstate and r_constraint) ends the batch: what follows it was not
-- attempted.
--
-- p_fault (tests only; NULL in production) fails the first attempt of this
-- call that placed, after its claims, slots, allocation and outbox event are
-- written and before its COMMIT:
--   'claims_inserted': raises out of the CALL (SQLSTATE P0001, the message
--       counts the claims the transaction saw), so that attempt is undone;
--   'claims_conflict': a serialization failure inside the attempt, as when a
--       concurrent writer gets in: reported as the 'error' entry above.
-- Defined by 0006; 0083 added p_fault.
CREATE OR REPLACE PROCEDURE gpuaas_place_batch(
    p_allocations  text[],
    p_claim_kinds  text[],
    p_profiles     jsonb[],
    p_images       text[],
    p_counts       integer[],
    p_nodes        text[],
    p_slots        text[],
    p_revision     text,
    p_fault        text DEFAULT NULL,
    INOUT r_placement  integer[] DEFAULT NULL,
    INOUT r_candidate  integer[] DEFAULT NULL,
    INOUT r_outcome    text[] DEFAULT NULL,
    INOUT r_detail     text[] DEFAULT NULL,
    INOUT r_claim_ids  text[] DEFAULT NULL,
    INOUT r_sqlstate   text DEFAULT NULL,
    INOUT r_constraint text DEFAULT NULL
)
LANGUAGE plpgsql AS $$
DECLARE
    first   integer := 1;
    res     record;
    failed  text;
BEGIN
    IF p_fault IS NOT NULL AND p_fault NOT IN ('claims_inserted', 'claims_conflict') THEN
        RAISE EXCEPTION 'unknown fault point %', p_fault USING ERRCODE = 'invalid_parameter_value';
    END IF;
    r_placement := '{}'; r_candidate := '{}'; r_outcome := '{}'; r_detail := '{}'; r_claim_ids := '{}';
    r_sqlstate := NULL; r_constraint := NULL;
    FOR i IN 1 .. coalesce(cardinality(p_allocations), 0) LOOP
        FOR j IN 1 .. p_counts[i] LOOP
            BEGIN
                res := gpuaas_place(p_allocations[i], p_nodes[first + j - 1], p_slots[first + j - 1]::integer[],
                                    p_claim_kinds[i], p_profiles[i], p_images[i], p_revision);
                IF p_fault = 'claims_conflict' AND res.outcome = 'placed' THEN
                    p_fault := NULL;  -- once per call
                    RAISE EXCEPTION 'fault injected at claims_conflict after % claim(s) of % were written',
                            (SELECT count(*) FROM allocation_resource_claims WHERE allocation_id = p_allocations[i]),
                            p_allocations[i]
                        USING ERRCODE = 'serialization_failure';
                END IF;
            EXCEPTION WHEN integrity_constraint_violation OR serialization_failure OR deadlock_detected
                           OR lock_not_available THEN
                GET STACKED DIAGNOSTICS r_sqlstate = RETURNED_SQLSTATE, r_constraint = CONSTRAINT_NAME,
                                        failed = MESSAGE_TEXT;
            END;
            r_placement := r_placement || i;
            r_candidate := r_candidate || j;
            IF r_sqlstate IS NOT NULL THEN
                r_outcome := r_outcome || 'error'::text;
                r_detail := r_detail || failed;
                r_claim_ids := r_claim_ids || NULL::text;
                ROLLBACK;
                RETURN;
            END IF;
            r_outcome := r_outcome || res.outcome;
            r_detail := r_detail || res.detail;
            r_claim_ids := r_claim_ids || array_to_string(res.claim_ids, ',');
            IF res.outcome = 'placed' THEN
                IF p_fault = 'claims_inserted' THEN
                    RAISE EXCEPTION 'fault injected at claims_inserted after % claim(s) of % were written',
                            (SELECT count(*) FROM allocation_resource_claims WHERE allocation_id = p_allocations[i]),
                            p_allocations[i];
                END IF;
                COMMIT;
            ELSE
                ROLLBACK;
            END IF;
            EXIT WHEN res.outcome NOT IN ('lost_race', 'refused');
        END LOOP;
        first := first + p_counts[i];
    END LOOP;
END
$$;
