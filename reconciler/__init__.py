"""The central reconciler: desired state in git -> placements -> claims in PostgreSQL.

Pure parts (topology graph, planner) take plain data and return values; the
store, apply and watch loop are the imperative shell around them. The `gpuaas`
command line lives here too (`reconciler.cli`).
"""
