"""A workload suite for judging packing on shapes it was not tuned to.

Each `Family` is a request-stream recipe: a GPU-count mix, a baremetal
share, a duration law, an arrival process and whether requests carry
rounded lease terms. `family_rows()` draws one stream; it is a pure
function of (family, offers, load, requests, seed). `run()` replays every
family at each load and seed through every policy on one synthetic fleet
(`synthesis.fleet_documents`) and sums, per family and load, the accepted
and the fluid-bound GPUs over the seeds. docs/placement.md ("Workload
suite") says where each mix comes from.

Bursty arrivals are a two-state Markov-modulated Poisson process built by a
time change: the Poisson stream of `synthesis.workload_rows` runs on an
"operational" clock, and real time runs `BURST_FACTOR` x slower in calm
periods than in bursts, so the mean rate (and the offered load) is that of
the Poisson stream while arrivals come in clumps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from desired import models as m
from desired.state import DesiredState
from policies import packing
from reconciler.placement import reserving, simulation, synthesis
from reconciler.placement.reserving import Reserve
from reconciler.placement.synthesis import Offer, WorkloadRow

# GPU-count mixes (share of slice requests). Sources and caveats: docs/placement.md, "Workload suite".
SYNTH_MIX: Mapping[int, float] = {1: 0.40, 2: 0.25, 4: 0.20, 8: 0.05}  # today's generator (synthesis.DEFAULT_MIX)
PHILLY_MIX: Mapping[int, float] = {1: 0.70, 2: 0.12, 4: 0.10, 8: 0.08}  # Microsoft Philly, ATC'19 (approx.)
PAI_MIX: Mapping[int, float] = {1: 0.85, 2: 0.06, 4: 0.05, 8: 0.04}  # Alibaba PAI 2020, NSDI'22 (approx.)
HELIOS_MIX: Mapping[int, float] = {1: 0.80, 2: 0.10, 4: 0.07, 8: 0.03}  # SenseTime Helios, SC'21 (approx.)
ONE_GPU_MIX: Mapping[int, float] = {1: 0.90, 2: 0.06, 4: 0.03, 8: 0.01}
EIGHT_GPU_MIX: Mapping[int, float] = {1: 0.20, 2: 0.10, 4: 0.20, 8: 0.50}

BURST_FACTOR = 4.0  # arrival rate in a burst / in a calm period
BURST_SHARE = 0.2  # share of real time spent in bursts
CALM_MEAN_S = 4 * 3600.0  # mean length of a calm period, real seconds
NODES = 64


@dataclass(frozen=True, slots=True)
class Family:
    """One workload shape of the suite."""

    name: str
    mix: Mapping[int, float]
    baremetal: float = 0.0  # share of requests that lease a whole node
    sigma: float = 1.5  # lognormal sigma of durations; 0 = exponential (light tail)
    bursty: bool = False  # Markov-modulated arrivals instead of Poisson
    terms: bool = False  # requests carry rounded lease terms (30% bought longer than used)
    held_out: bool = False  # not looked at while designing `default` (reported apart)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mix": {str(k): v for k, v in sorted(self.mix.items())},
            "baremetal": self.baremetal,
            "sigma": self.sigma,
            "bursty": self.bursty,
            "terms": self.terms,
            "held_out": self.held_out,
            "note": self.note,
        }


FAMILIES: tuple[Family, ...] = (
    Family("synth", SYNTH_MIX, 0.10, 1.5, note="the generator default was tuned on"),
    Family("philly", PHILLY_MIX, 0.05, 2.0, note="Philly job sizes, heavy tail"),
    Family("pai", PAI_MIX, 0.0, 1.0, note="Alibaba PAI sizes, no baremetal"),
    Family("one-gpu", ONE_GPU_MIX, 0.0, 0.0, note="1-GPU heavy, exponential durations (light tail)"),
    Family("eight-gpu", EIGHT_GPU_MIX, 0.20, 1.5, note="8-GPU heavy, 20% baremetal"),
    Family("philly-terms", PHILLY_MIX, 0.10, 2.0, terms=True, note="rounded lease terms"),
    Family("synth-bursty", SYNTH_MIX, 0.10, 1.0, bursty=True, note="MMPP arrivals"),
    Family(
        "helios-bursty-bm",
        HELIOS_MIX,
        0.15,
        2.0,
        bursty=True,
        terms=True,
        held_out=True,
        note="held out: Helios sizes, 15% baremetal, bursts, terms",
    ),
)


def family(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(name)


def bursty_times(times: Sequence[float], seed: int) -> list[float]:
    """Map Poisson arrival times (operational clock) onto a two-state MMPP's real clock.

    State lengths are exponential in real time (calm mean `CALM_MEAN_S`, burst
    mean chosen so bursts take `BURST_SHARE` of real time); the operational
    clock runs `BURST_FACTOR` times faster in a burst than in calm, at a speed
    set so both clocks have the same mean speed (the same offered load).
    """
    rnd = random.Random(seed * 104729 + 3)  # noqa: S311  # seeded, reproducible simulation input
    burst_mean = CALM_MEAN_S * BURST_SHARE / (1 - BURST_SHARE)
    # operational seconds per real second: c in calm, F x c in a burst; their mean over real time is 1.
    calm_rate = 1.0 / ((1 - BURST_SHARE) + BURST_SHARE * BURST_FACTOR)  # operational s per real s, calm
    burst_rate = calm_rate * BURST_FACTOR
    out = []
    real = op = 0.0
    in_burst = False
    state_end_real = rnd.expovariate(1 / CALM_MEAN_S)
    for t_op in times:
        while True:
            rate = burst_rate if in_burst else calm_rate
            op_at_end = op + (state_end_real - real) * rate
            if t_op <= op_at_end:
                real += (t_op - op) / rate
                op = t_op
                break
            real, op = state_end_real, op_at_end
            in_burst = not in_burst
            state_end_real = real + rnd.expovariate(1 / (burst_mean if in_burst else CALM_MEAN_S))
        out.append(round(real, 3))
    return out


def family_rows(
    fam: Family, offers: list[Offer], *, load: float, requests: int, seed: int, baremetal_sku: str | None
) -> list[WorkloadRow]:
    """One stream of `fam` at `load`: pure in its arguments."""
    offers = [replace(o, mix={g: w for g, w in fam.mix.items() if g in o.mix}) for o in offers]
    bare = (baremetal_sku, fam.baremetal) if baremetal_sku and fam.baremetal > 0 else None
    rows = synthesis.workload_rows(
        offers, load=load, requests=requests, seed=seed, baremetal=bare, duration_sigma=fam.sigma
    )
    if fam.bursty:
        times = bursty_times([r.arrival_s for r in rows], seed)
        rows = [replace(r, arrival_s=t) for r, t in zip(rows, times, strict=True)]
    if fam.terms:
        rows = synthesis.lease_terms(rows, early_release=0.3, seed=seed)
    return rows


@dataclass(slots=True)
class Cell:
    """One family at one load, summed over seeds: GPUs accepted per policy and by the fluid bound."""

    family: str
    load: float
    held_out: bool
    offered: int = 0
    fluid: int = 0
    accepted: dict[str, int] = field(default_factory=dict)
    # per seed, in run order: (offered GPUs, fluid-bound GPUs, GPUs accepted per policy)
    seeds: list[tuple[int, int, dict[str, int]]] = field(default_factory=list)
    # wait-and-retry mode only, per policy: [placed requests, summed wait s, expired requests, summed per-seed p95 s]
    waits: dict[str, list[float]] = field(default_factory=dict)

    def add_waits(self, policy: str, res: simulation.Result) -> None:
        if res.wait_s is None:
            return
        w = self.waits.setdefault(policy, [0.0, 0.0, 0.0, 0.0])
        w[0] += res.accepted_requests
        w[1] += res.mean_wait_s * res.accepted_requests
        w[2] += res.expired_requests
        w[3] += res.p95_wait_s

    def wait_figures(self, policy: str) -> dict[str, float] | None:
        """Requests expired, mean wait of the placed ones, and the mean over seeds of each stream's p95 wait."""
        w = self.waits.get(policy)
        if w is None:
            return None
        n = len(self.seeds) or 1
        return {
            "expired_requests": int(w[2]),
            "mean_wait_s": round(w[1] / w[0], 1) if w[0] else 0.0,
            "p95_wait_s": round(w[3] / n, 1),
        }

    def wait_note(self, policy: str) -> str:
        f = self.wait_figures(policy)
        if f is None:
            return ""
        expired, mean, p95 = f["expired_requests"], f["mean_wait_s"], f["p95_wait_s"]
        return f"{policy}: {expired:.0f} expired, wait mean {mean:.0f} s, p95 {p95:.0f} s"

    def acceptance(self, policy: str) -> float:
        return self.accepted.get(policy, 0) / self.offered if self.offered else 1.0

    @property
    def fluid_bound(self) -> float:
        return self.fluid / self.offered if self.offered else 1.0

    @property
    def best_baseline(self) -> str:
        names = [p.value for p in packing.BASELINES if p.value in self.accepted]
        return max(names, key=lambda n: (self.accepted[n], -names.index(n)))

    @property
    def closed(self) -> float | None:
        """Share of the best baseline's gap to the fluid bound that `default` closes (None: no gap)."""
        best = self.acceptance(self.best_baseline)
        gap = self.fluid_bound - best
        if gap <= 0:
            return None
        return (self.acceptance(packing.Policy.DEFAULT.value) - best) / gap

    @property
    def closed_by_seed(self) -> list[float]:
        """`closed` of each seed's stream alone, against the cell's best baseline (seeds with no gap left out)."""
        best, mine = self.best_baseline, packing.Policy.DEFAULT.value
        out = []
        for _, fluid, accepted in self.seeds:
            gap = fluid - accepted.get(best, 0)
            if gap > 0:
                out.append((accepted.get(mine, 0) - accepted.get(best, 0)) / gap)
        return out

    @property
    def closed_se(self) -> float | None:
        """Standard error of `closed` over the cell's streams: how far the figure moves with its seeds.

        `closed` is a ratio of sums (default's gain over the best baseline /
        the best baseline's gap, summed over seeds), so this is the ratio
        estimator's standard error: streams weigh by their gap, and a stream
        with almost none left does not blow it up. At 64 hosts one changed
        decision moves a whole trajectory; a miss within about two of these
        says little about the policy (docs/placement.md, "Workload suite").
        """
        closed, n = self.closed, len(self.seeds)
        if closed is None or n < 2:
            return None
        best, mine = self.best_baseline, packing.Policy.DEFAULT.value
        gains = [(a.get(mine, 0) - a.get(best, 0), fluid - a.get(best, 0)) for _, fluid, a in self.seeds]
        mean_gap = sum(g for _, g in gains) / n
        if mean_gap <= 0:
            return None
        return math.sqrt(sum((d - closed * g) ** 2 for d, g in gains) / (n * (n - 1))) / mean_gap

    @property
    def below(self) -> list[str]:
        """Baselines that accepted more GPUs than `default`."""
        mine = self.accepted.get(packing.Policy.DEFAULT.value, 0)
        return [p.value for p in packing.BASELINES if self.accepted.get(p.value, 0) > mine]

    def as_dict(self) -> dict[str, Any]:
        closed = self.closed
        return {
            "family": self.family,
            "load": self.load,
            "held_out": self.held_out,
            "offered_gpus": self.offered,
            "fluid_bound_gpu": round(self.fluid_bound, 6),
            "acceptance_gpu": {p: round(self.acceptance(p), 6) for p in self.accepted},
            "best_baseline": self.best_baseline,
            "gap_closed": None if closed is None else round(closed, 4),
            "gap_closed_by_seed": [round(x, 4) for x in self.closed_by_seed],
            "gap_closed_se": None if (se := self.closed_se) is None else round(se, 4),
            "below": self.below,
            **({"waits": {p: self.wait_figures(p) for p in self.waits}} if self.waits else {}),
        }


Progress = Callable[[int, int, str], None]  # done, total, what


def fleet(nodes: int = NODES) -> DesiredState:
    return synthesis.desired_state(list(synthesis.fleet_documents(nodes, seed=1)))


def run(
    families: Sequence[Family],
    loads: Sequence[float],
    *,
    seeds: int,
    requests: int,
    nodes: int = NODES,
    first_seed: int = 1,
    progress: Progress | None = None,
    lease_ends: simulation.LeaseEnds = simulation.LeaseEnds.TERMS,
    reserve: Reserve | None = None,
    wait_s: float | None = None,
    whole_host_reserve: m.WholeHostReserve | None = None,
) -> list[Cell]:
    """Every family x load x seed (`first_seed` ... `first_seed + seeds - 1`) through every policy.

    One `Cell` per family and load. Seeds past the ones a policy was chosen
    on (1-6 for issue 31's `default`) are fresh streams: `--first-seed 7`.
    `lease_ends` is what each request tells the planner of its end
    (`simulation.LeaseEnds`; only `default` reads it): `exact` measures what
    knowing every departure would be worth on each family, an oracle.
    `reserve` holds empty hosts back from small requests under `default`
    (`reserving.Reserve`, research; the baselines are never gated).
    `wait_s` replays every policy in wait-and-retry mode (`simulation`):
    accepted GPUs are those placed within the wait, the fluid figure is the
    fluid queue's, and each cell also sums expired requests and waits.
    `whole_host_reserve` is set on the fleet: with `wait_s`, `default` keeps
    empty hosts for whole-host requests by the planner's rule (`reserving.Holding`).
    """
    desired = fleet(nodes)
    if whole_host_reserve is not None:
        reserving.set_on_fleet(desired, whole_host_reserve)
    bare = sorted(s for s, sku in desired.skus.items() if sku.capacity_shape.value == "baremetal")
    offers = simulation.offers(desired, dict(SYNTH_MIX))
    policies = [p.value for p in packing.ALL]
    total = len(families) * len(loads) * seeds * len(policies)
    done = 0
    cells = []
    for fam in families:
        for load in loads:
            cell = Cell(fam.name, load, fam.held_out)
            for seed in range(first_seed, first_seed + seeds):
                rows = family_rows(
                    fam, offers, load=load, requests=requests, seed=seed, baremetal_sku=bare[0] if bare else None
                )
                accepted: dict[str, int] = {}
                offered = fluid = 0
                for name in policies:
                    res = simulation.simulate(
                        desired, rows, policy=name, lease_ends=lease_ends, reserve=reserve, wait_s=wait_s
                    )
                    accepted[name] = res.accepted_gpus
                    cell.add_waits(name, res)
                    cell.accepted[name] = cell.accepted.get(name, 0) + res.accepted_gpus
                    if name == policies[0]:
                        offered, fluid = res.offered_gpus, round(res.fluid_bound_gpu * res.offered_gpus)
                        cell.offered += offered
                        cell.fluid += fluid
                    done += 1
                    if progress is not None:
                        progress(done, total, f"{fam.name} load {load} seed {seed} {name}")
                cell.seeds.append((offered, fluid, accepted))
            cells.append(cell)
    return cells


def goal_misses(cells: Sequence[Cell], *, goal_load: float = 0.9, goal: float = 0.25) -> list[str]:
    """Sentences for every cell where `default` is below a baseline, or closes < `goal` at `goal_load`."""
    out = []
    for c in cells:
        if c.below:
            out.append(f"{c.family} at load {c.load}: default below {', '.join(c.below)}")
        closed = c.closed
        if math.isclose(c.load, goal_load) and closed is not None and closed < goal:
            out.append(f"{c.family} at load {c.load}: default closes {closed:.0%} of the gap (< {goal:.0%})")
    return out
