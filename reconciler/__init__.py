"""The central reconciler: desired state in git -> placements -> claims in PostgreSQL.

Its layers, top to bottom (a layer imports only those below it; the
`layers` contract in pyproject.toml checks it):

  commands    `gpuaas` subcommands, one module per group; cli/parsing/exiting frame them
  service     `gpuaas serve`: API, dashboard, metrics, the host agents' way in
  loop        the GitOps loop and the revisions it follows
  reports     read models the CLI and the service share (status, history, summary)
  reconcile   one reconciliation, baremetal leases, saved plans, request files
  store       PostgreSQL: inventory, claims, host plans, history (beside it: providers)
  placement   the pure planner and its inputs
  plans       plan values (beside it: sources, reading a desired-state revision)

Pure parts (placement, plans) take plain data and return values; the store,
the reconciliation and the loop are the imperative shell around them.
"""
