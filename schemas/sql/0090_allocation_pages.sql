-- The read API's allocation list in request order, a page at a time (GET /api/v1/allocations).
--
-- A page of 50 sorted all of the matching allocations first (a tenant's, or every one), and the
-- list's total was a window over all of them: 46 ms for the first page at 20,000 allocations. With
-- these the page is read from the index in order and stops at its end; the total is a count apart
-- (reconciler/service/allocationreads.py). The portal lists one tenant's allocations.
CREATE INDEX allocations_requested ON allocations (requested_at, id);
CREATE INDEX allocations_tenant_requested ON allocations (tenant, requested_at, id);
