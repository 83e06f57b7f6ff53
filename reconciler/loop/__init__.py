"""The GitOps loop: follow git revisions and reconcile each new one.

Modules (import the module, call through it):
  watching  `Loop`: reconcile each new committed revision once, retry what waits, record everything
  heads     the revisions it follows: a local checkout's HEAD, a polled remote branch

It sits above the reports, the reconciliation, the store and placement, and
below the commands and the service (the `layers` contract in pyproject.toml).
"""
