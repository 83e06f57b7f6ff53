"""One reconciliation of a desired state, and what feeds it.

Modules (import the module, call through it):
  reconciling  `reconcile(conn, state)`: sync inventory, absorb reports, plan, apply, write host plans, record
  leasing      baremetal leases through their machine provider, one phase a reconciliation
  planfiles    saved plans: `gpuaas plan --out FILE` writes one, `gpuaas apply FILE` applies exactly it
  requests     allocation requests as the portal bot commits them to git

It drives the store and the pure planner; the loop, the commands and the
service sit above it (the `layers` contract in pyproject.toml).
"""
