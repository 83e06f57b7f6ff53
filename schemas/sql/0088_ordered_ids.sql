-- Node and slot ids in the order rows are written (gpuaas_uuid7), not random.
--
-- A random uuid key lands on a random leaf of each btree that leads with it: the primary keys, the
-- (id, node_id, slot_index) key claims refer to, and (node_id, slot_index). A cold sync of 10,000
-- nodes inserts 80,000 slot rows into those; with ids in load order each insert goes to the right
-- edge of the index (PostgreSQL alone, 80,000 slot rows: about 0.70 s -> 0.55 s). And a table's
-- node_id then follows its physical order (slots are written node by node), so the planner reads
-- the slots of a batch of nodes (the host plans') through the index instead of scanning every row.
-- Ids stay opaque: nothing orders by them or reads the time in them. Rows already stored keep theirs.
\ir functions/gpuaas_uuid7.sql

ALTER TABLE nodes ALTER COLUMN id SET DEFAULT gpuaas_uuid7();
ALTER TABLE node_resource_slots ALTER COLUMN id SET DEFAULT gpuaas_uuid7();
