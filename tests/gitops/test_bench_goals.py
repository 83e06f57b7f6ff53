"""The goals the benches check are the issue's: commit -> claim p50 <= 1 s to 10,000 nodes, <= 2 s past it."""

from __future__ import annotations

from gpuaas_tools.bench import gitops


def test_the_gitops_goal_follows_the_fleet_size() -> None:
    assert [gitops.goal_p50_s(n) for n in (100, 2_000, 10_000, 10_001, 100_000)] == [1.0, 1.0, 1.0, 2.0, 2.0]
