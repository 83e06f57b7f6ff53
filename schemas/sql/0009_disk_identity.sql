-- The approved identity of a slot disk (issue 13: a re-pointed by-id link must
-- never send a wipe to another disk). The SlotMap's optional `nvme_identity`
-- (model, serial, wwid, size_bytes; backing_file on lab loop devices), as
-- discovery read it from sysfs, travels slot map -> node_resource_slots ->
-- host plan (`disk_identities`) -> the host's disk guard, which compares it with
-- the block device before every write, wipe and verify.
--
-- NULL: the slot map records no identity (the by-id path alone, as before).
-- A domain, not a table CHECK: placements update slot rows all the time, and a
-- domain's check runs only when this column is assigned (see 0006).

CREATE DOMAIN gpuaas_disk_identity AS jsonb
    CHECK (VALUE IS NULL OR (jsonb_typeof(VALUE) = 'object'
                             AND jsonb_typeof(VALUE -> 'size_bytes') = 'number'));

ALTER TABLE node_resource_slots ADD COLUMN nvme_identity gpuaas_disk_identity;
