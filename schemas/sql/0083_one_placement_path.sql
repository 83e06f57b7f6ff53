-- One SQL path for placement, and function bodies in one place (issue 28).
--
-- The live body of every function a migration changed after creating it is
-- kept in schemas/sql/functions/<name>.sql; a migration that changes one
-- edits that file and re-applies it with `\ir functions/<name>.sql` (the
-- runner includes the file, as psql's \ir would). The earlier migrations keep
-- the bodies they applied: a database upgraded from any version runs them as
-- they were (0008's repair, for one, must run under 0008's rule).
--
-- gpuaas_place_batch takes p_fault, so the fault-injection tests run the
-- procedure production runs; the per-attempt client transaction is gone.
DROP PROCEDURE gpuaas_place_batch(text[], text[], jsonb[], text[], integer[], text[], text[], text,
                                  integer[], integer[], text[], text[], text[], text, text);
\ir functions/gpuaas_place_batch.sql

-- Unchanged, applied from their files from here on.
\ir functions/claims_guard_insert.sql
\ir functions/claim_cleanup_proven.sql
\ir functions/claim_cleanup_failed.sql
\ir functions/gpuaas_place.sql
\ir functions/gpuaas_valid_step_errors.sql
\ir functions/gpuaas_create_node_role.sql
\ir functions/gpuaas_provision_failures.sql
