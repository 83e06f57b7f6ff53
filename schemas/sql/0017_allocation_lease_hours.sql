-- Allocation.lease_hours (the lease term the portal sends) was lost between git and the
-- database: status and plan rebuild desired state from these rows and dropped it.
ALTER TABLE allocations ADD COLUMN lease_hours double precision CHECK (lease_hours IS NULL OR lease_hours > 0);
