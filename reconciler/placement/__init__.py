"""Placement: pure functions from desired state and observed facts to a plan, with no I/O.

No database, git, driver or subprocess import (an import-linter contract),
so the planner, the simulator and `gpuaas plan --offline` run anywhere and
test without fixtures.

Modules (import the module, call through it):
  index          the engine's indexes: nodes by free-slot pattern, by when they empty
  placing        `Engine`, the facade: place, release, explain, counts, modes
  requests       what a request asks and what the engine answers
  fleetstate     nodes, claims, partitions and indexes; warm upkeep between revisions
  picking        which node a request gets; strategies holds one object per slice ranking
  counting       launchable counts without placing probes
  explaining     why a request is refused
  nodestatus     the facts a node's mode is derived from
  planner        `plan(desired, observed)` on top of the engine
  replanning     `WarmPlanner`: one kept engine re-planned by difference
  reasons        stable pending codes
  capacity       the capacity read model: launchable counts per region x SKU, and why not more
  prplan         what merging a PR would do (base vs head plans); prplan_summary groups it, prplan_render prints it
  synthesis      synthetic fleets and workloads; simulation replays them through the engine

Design and decisions: docs/placement.md.
"""
