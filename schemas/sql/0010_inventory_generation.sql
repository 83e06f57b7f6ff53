-- Incremental inventory sync (issue 10). Every sync that writes an inventory
-- row bumps this counter in the same transaction. A reconciler that remembers
-- the rows it synced trusts that memory only while the counter is the value
-- its own last sync left; any other writer makes it re-read every row.
CREATE TABLE inventory_generation (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    generation bigint NOT NULL DEFAULT 0
);
INSERT INTO inventory_generation (singleton, generation) VALUES (true, 0);
