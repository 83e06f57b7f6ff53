"""Contracts shared by both agents: the JSON Schemas of the desired-state kinds, the
SQL migrations, the error types, and what the central and host reconcilers exchange.

Nothing here imports `reconciler` or `host_reconciler`; both import from here.
"""
