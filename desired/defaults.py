"""The defaults of the desired state, named once.

The Fleet model's fields default to these (desired/models.py), and the
central reconciler falls back on the same values where a Fleet is absent or
a stored column is empty (the planner, the reconciliation, host plans, the
lifecycle settings). Plain constants, no imports: every layer may read them.
"""

from __future__ import annotations

# Candidate nodes `apply` tries for one placement after lost races (Fleet.placement.max_claim_attempts).
CLAIM_CANDIDATES = 5

# Provision attempts per allocation before it fails (Fleet.max_provision_attempts).
PROVISION_ATTEMPTS = 3

# Seconds a host agent may stay silent before its node is unavailable (Fleet.host_liveness_ttl_seconds).
HOST_LIVENESS_TTL_S = 90

# Seconds a VM gets to shut down before it is destroyed (Fleet.graceful_shutdown_timeout_s).
SHUTDOWN_TIMEOUT_S = 120

# Seconds a new VM has to pass readiness (Fleet.readiness_timeout_seconds, stored as readiness_timeout_s).
READINESS_TIMEOUT_S = 300
