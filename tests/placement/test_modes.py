"""Node modes and seed 000's mixed-node transition table (policies.modes).

One parametrized row per row of the seed's table, in the seed's order, plus
the mode each state derives to.
"""

from __future__ import annotations

import pytest

from desired.models import AdminState as A
from desired.models import StorageMode as S
from policies import modes
from policies.capability import Capability as C
from policies.modes import Mode, ModeFacts, Target

EMPTY = ModeFacts(C.BOTH_CAPABLE, free_slots=8)
PARTIAL = ModeFacts(C.BOTH_CAPABLE, slot_claims=3, free_slots=5)
FULL = ModeFacts(C.BOTH_CAPABLE, slot_claims=8, free_slots=0)
BAREMETAL = ModeFacts(C.BOTH_CAPABLE, exclusive_claim=True)

# (seed row, from-state facts, target, allowed, code)
TABLE = [
    ("fully available -> slice use: allowed when slice-capable with approved slots", EMPTY, Target.SLICE_USE, True, ""),
    (
        "fully available -> slice use: not without slice capability",
        ModeFacts(C.SLICE_CANDIDATE, free_slots=8),
        Target.SLICE_USE,
        False,
        modes.NOT_SLICE_CAPABLE,
    ),
    (
        "fully available -> slice use: not without approved slots",
        ModeFacts(C.SLICE_CANDIDATE, free_slots=0),
        Target.SLICE_USE,
        False,
        modes.NOT_SLICE_CAPABLE,
    ),
    (
        "fully available -> baremetal use: allowed when no slot or claim is reserved/active",
        EMPTY,
        Target.BAREMETAL_USE,
        True,
        "",
    ),
    (
        "partially allocated by slices -> baremetal use: blocked until every slice claim releases",
        PARTIAL,
        Target.BAREMETAL_USE,
        False,
        modes.SLICE_ACTIVE,
    ),
    (
        "partially allocated by slices -> baremetal use: blocked until cleanup passes",
        ModeFacts(C.BOTH_CAPABLE, cleanup_slots=1, free_slots=7),
        Target.BAREMETAL_USE,
        False,
        modes.CLEANUP_PENDING,
    ),
    ("partially allocated by slices -> draining: allowed", PARTIAL, Target.DRAINING, True, ""),
    ("fully allocated by slices -> draining: allowed", FULL, Target.DRAINING, True, ""),
    ("any active allocation -> unavailable: allowed on health failure", PARTIAL, Target.UNAVAILABLE, True, ""),
    (
        "slot cleanup failed -> cleanup blocked: only the affected slot",
        PARTIAL,
        Target.CLEANUP_BLOCKED,
        True,
        modes.CLEANUP_BLOCKED,
    ),
    (
        "slot cleanup failed -> cleanup blocked: the whole node on node-wide corruption",
        ModeFacts(C.BOTH_CAPABLE, node_corrupt=True),
        Target.CLEANUP_BLOCKED,
        True,
        modes.UNAVAILABLE,
    ),
    (
        "cleanup blocked -> available: only after repair or a passing probe clears the slots",
        ModeFacts(C.BOTH_CAPABLE, blocked_slots=1, free_slots=7),
        Target.AVAILABLE,
        False,
        modes.CLEANUP_BLOCKED,
    ),
    (
        "cleanup blocked -> available: allowed once cleared",
        ModeFacts(C.BOTH_CAPABLE, free_slots=8),
        Target.AVAILABLE,
        True,
        "",
    ),
    (
        "baremetal active -> slice use: blocked until release and reimage",
        BAREMETAL,
        Target.SLICE_USE,
        False,
        modes.BAREMETAL_ACTIVE,
    ),
    (
        "host share storage mounted -> slice use: blocked until unmounted and approved",
        ModeFacts(C.SLICE_CANDIDATE, storage_mode=S.SHARE, free_slots=8),
        Target.SLICE_USE,
        False,
        modes.STORAGE_NOT_SLICE,
    ),
    (
        "slice active -> baremetal use: blocked until every claim releases and cleanup passes",
        FULL,
        Target.BAREMETAL_USE,
        False,
        modes.SLICE_ACTIVE,
    ),
    (
        "slice active -> share storage: blocked until claims release, cleanup passes, infra remounts",
        PARTIAL,
        Target.SHARE_STORAGE,
        False,
        modes.SLICE_ACTIVE,
    ),
    (
        "slice-capable -> baremetal-capable: derived from claims; a clear node takes baremetal",
        EMPTY,
        Target.SHARE_STORAGE,
        True,
        "",
    ),
    (
        "admin drain forces the next shape: a draining node takes no slice",
        ModeFacts(C.BOTH_CAPABLE, admin_state=A.DRAINING, free_slots=8),
        Target.SLICE_USE,
        False,
        modes.DRAINING,
    ),
    (
        "admin drain forces the next shape: a draining node takes no baremetal either",
        ModeFacts(C.BOTH_CAPABLE, admin_state=A.DRAINING),
        Target.BAREMETAL_USE,
        False,
        modes.DRAINING,
    ),
    (
        "maintenance takes nothing new",
        ModeFacts(C.BOTH_CAPABLE, admin_state=A.MAINTENANCE, free_slots=8),
        Target.SLICE_USE,
        False,
        modes.MAINTENANCE,
    ),
    (
        "an unhealthy node takes nothing new",
        ModeFacts(C.BOTH_CAPABLE, healthy=False, free_slots=8),
        Target.BAREMETAL_USE,
        False,
        modes.UNAVAILABLE,
    ),
    (
        "a baremetal-only node never serves slices",
        ModeFacts(C.BAREMETAL_ONLY),
        Target.SLICE_USE,
        False,
        modes.NOT_SLICE_CAPABLE,
    ),
    ("a full slice node has no free slot", FULL, Target.SLICE_USE, False, modes.NO_FREE_SLOTS),
]


@pytest.mark.parametrize(("row", "facts", "target", "allowed", "code"), TABLE, ids=[r[0][:60] for r in TABLE])
def test_transition_table(row: str, facts: ModeFacts, target: Target, allowed: bool, code: str) -> None:
    verdict = modes.transition(facts, target)
    assert (verdict.allowed, verdict.code) == (allowed, code), row
    if not allowed:
        assert verdict.message


def test_cleanup_blocked_scope() -> None:
    assert modes.transition(PARTIAL, Target.CLEANUP_BLOCKED).scope == "slot"
    assert modes.transition(ModeFacts(C.BOTH_CAPABLE, node_corrupt=True), Target.CLEANUP_BLOCKED).scope == "node"


@pytest.mark.parametrize(
    ("facts", "mode", "occupancy"),
    [
        (ModeFacts(C.BAREMETAL_ONLY), Mode.BAREMETAL_ONLY, modes.Occupancy.EMPTY),
        (ModeFacts(C.SLICE_CANDIDATE), Mode.SLICE_CANDIDATE, modes.Occupancy.EMPTY),
        (EMPTY, Mode.BOTH_CAPABLE, modes.Occupancy.EMPTY),
        (PARTIAL, Mode.SLICE_ACTIVE, modes.Occupancy.PARTIAL),
        (FULL, Mode.SLICE_ACTIVE, modes.Occupancy.FULL),
        (BAREMETAL, Mode.BAREMETAL_ACTIVE, modes.Occupancy.EXCLUSIVE),
        (
            ModeFacts(C.BOTH_CAPABLE, admin_state=A.DRAINING, slot_claims=2, free_slots=6),
            Mode.DRAINING,
            modes.Occupancy.PARTIAL,
        ),
        (ModeFacts(C.BOTH_CAPABLE, blocked_slots=1, free_slots=7), Mode.CLEANUP_BLOCKED, modes.Occupancy.EMPTY),
        (ModeFacts(C.BOTH_CAPABLE, blocked_slots=1, slot_claims=1), Mode.SLICE_ACTIVE, modes.Occupancy.FULL),
        (ModeFacts(C.BOTH_CAPABLE, healthy=False, slot_claims=2), Mode.UNAVAILABLE, modes.Occupancy.FULL),
        (ModeFacts(C.BOTH_CAPABLE, admin_state=A.MAINTENANCE), Mode.UNAVAILABLE, modes.Occupancy.EMPTY),
    ],
)
def test_mode_is_derived(facts: ModeFacts, mode: Mode, occupancy: modes.Occupancy) -> None:
    assert modes.mode(facts) is mode
    assert modes.occupancy(facts) is occupancy
