"""The PostgreSQL store: durable claims, inventory, host plans and status.

The database is the guard. Constraints and triggers (schemas/sql/) refuse a
double claim, an exclusive/slot overlap and a claim on an unclaimable slot,
whatever the Python does; the code here takes row locks, calls the
one-round-trip placement functions, and retries a lost race with the
planner's next candidate.

Modules (import the module, call through it):
  embedded     private PostgreSQL server under a state dir (initdb/pg_ctl as `postgres`)
  connections  where the database is (GPUAAS_DATABASE_URL or embedded) and connecting
  migrations   versioned schemas/sql/NNNN_*.sql, recorded in schema_migrations
  inventory    project a DesiredState at a revision into rows (idempotent)
  inventoryrows  the rows each document becomes, and the content hash of a desired state
  live         read Observed (claims, slot states, host facts) for the planner
  claims       write a Plan: placements, pending reasons, releases
  cleanup      absorb host reports: VM ready -> active, wipe proof -> slot free
  hostplans    write one host plan per node, generation bumped on change
  hoststatus   read what the hosts reported (host_status, host_slot_status) for `gpuaas drift`
  checks       invariant queries (`gpuaas db check`)
  history      reconciliation runs
  lifecycle    allocation lifecycle, reschedules, quarantined slots, host liveness
  synthetic    synthetic fleets for benchmarks and race tests
  views        desired state and allocations rebuilt from the rows, for `gpuaas status` / `plan` ([gitops])
  revisions    per-revision lock and applied-by check for the watch loop ([gitops])

Schema and SQL functions: schemas/sql/0001-0049 (this package), 0050+ (later features).
psycopg errors -> project errors: schemas/dberrors.py. The whole reconciliation
of a revision: reconciler/reconcile/reconciling.py. Design and decisions: docs/claims.md.
"""
