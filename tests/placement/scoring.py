"""`default`'s documented ranking computed by scoring every node: what the packing index must agree with."""

from __future__ import annotations

from policies import packing
from reconciler.placement import placing


def ranked(engine: placing.Engine, req: placing.Request) -> list[tuple[str, tuple[int, ...]]]:
    """Every node that can take the request, best first, by scoring each one: what the index must agree with."""
    spec = engine.spec(req.sku, req.gpu_count)
    assert not isinstance(spec, placing.Refused)
    scored = []
    for node in engine.state.nodes:
        for part, _lid, lay in node.views:
            free = lay.full & ~node.claimed
            o = packing.option(
                packing.Policy.DEFAULT, lay, free, req.gpu_count, spec.rule, demands=engine.state.mixes[part.mix_id]
            )
            if o is None:
                continue
            rank = packing.rank(packing.Policy.DEFAULT, o)
            tie = packing.node_key(
                packing.Policy.DEFAULT, node.id, len(node.allocs), min(node.since.values()) if node.since else 0.0
            )
            if req.ends_at is None:
                key = packing.place_key(rank, tie)
            else:
                key = packing.lease_key(
                    packing.lease_rank(
                        rank,
                        packing.node_end(node.ends.values()),
                        req.requested_at,
                        req.ends_at,
                        engine.lease_end_weight,
                    ),
                    tie,
                )
            scored.append((key, node.name, tuple(node.slot_indexes[p] for p in o.choice.positions)))
    return [(name, slots) for _, name, slots in sorted(scored)]
