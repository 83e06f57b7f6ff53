-- The planner's observed state reads the slots that are neither free nor
-- simply claimed (reconciler/store/live `observe`) on every commit; without
-- an index that was a scan of every slot row. A partial index over those
-- rows (rare in a healthy fleet) makes the read cost what it returns ([perf2]).
--
-- A status change is no longer a HOT update (the predicate reads status); a
-- placement writes the slot row once per claim, so that costs one index
-- entry per index, where the scan cost every slot row per commit.

CREATE INDEX slots_status_odd ON node_resource_slots (node_id)
    WHERE status IN ('releasing', 'cleanup', 'cleanup_blocked', 'failed', 'disabled', 'quarantined');
