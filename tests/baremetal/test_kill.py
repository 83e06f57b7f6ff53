"""kill -9 of the reconcile loop mid-deploy and mid-erase, at random points (issue 30).

`gpuaas_tools.bench.leasekill.campaign` runs the loop in a subprocess and
SIGKILLs it after a random delay (or it kills itself right after a provider
call, before the database records it), 10 times here (`gpuaas bench
leasekill --kills 50` for more). Afterwards every lease was deployed exactly
once and erased exactly once (the simulator counts the calls it served),
every allocation is released, and `db check` finds nothing.
"""

from __future__ import annotations

import pytest

from gpuaas_tools.bench import leasekill


@pytest.mark.slow
def test_kill_nine_mid_deploy_and_mid_erase_deploys_and_erases_each_lease_once(db_url: str) -> None:
    doc = leasekill.campaign(db_url, leases=4, kills=10)
    assert doc["deploys_per_machine"] == {f"bm-{i:05d}": 1 for i in range(4)}, doc
    assert doc["erases_per_machine"] == {f"bm-{i:05d}": 1 for i in range(4)}, doc
    assert doc["allocations"] == {"released": 4} and doc["db_check"] == [], doc
    assert doc["ok"]
