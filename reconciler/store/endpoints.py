"""Public endpoints of slice allocations (allocation_endpoints, migrations 0057, 0058).

The database opens them in the placement's own transaction and frees them
when cleanup is proven (triggers in 0058); this module only reads them: for
the host plan (live endpoints of the VMs a node runs), the API and `status`
(an allocation's current endpoints) and `/metrics` (ports used per node).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from reconciler.store.connections import Connection
from schemas import dberrors

SSH_PORT = 22


@dataclass(frozen=True, slots=True)
class Endpoint:
    allocation_id: str
    node: str
    public_address: str
    public_port: int
    guest_port: int
    private_ip: str

    @property
    def ssh(self) -> bool:
        return self.guest_port == SSH_PORT

    def as_dict(self) -> dict[str, object]:
        return {
            "public_address": self.public_address,
            "public_port": self.public_port,
            "guest_port": self.guest_port,
            "private_ip": self.private_ip,
            "protocol": "tcp",
            "purpose": "ssh" if self.ssh else "extra",
        }


_CURRENT = (
    "SELECT e.allocation_id, n.name, host(e.public_address), e.public_port, e.guest_port,"
    " host(e.private_ip) FROM allocation_endpoints e JOIN nodes n ON n.id = e.node_id"
    " WHERE e.freed_at IS NULL AND e.node_id = (SELECT a.node_id FROM allocations a"
    " WHERE a.id = e.allocation_id) AND (%s::text[] IS NULL OR e.allocation_id = ANY(%s::text[]))"
    " ORDER BY e.allocation_id, e.guest_port <> 22, e.guest_port"
)


def _endpoints(rows: Iterable[tuple[object, ...]]) -> list[Endpoint]:
    return [Endpoint(str(a), str(n), str(addr), int(str(p)), int(str(g)), str(ip)) for a, n, addr, p, g, ip in rows]


def current(conn: Connection, allocation_ids: Iterable[str] | None = None) -> dict[str, list[Endpoint]]:
    """allocation id -> its live endpoints on the node it is placed on now (SSH first, then by guest port).

    A failed attempt's endpoints on another node stay live until that node's
    cleanup is proven; they are not the tenant's way in and are left out.
    """
    ids = None if allocation_ids is None else list(allocation_ids)
    with dberrors.wrapped("read allocation endpoints"):
        rows = conn.execute(_CURRENT, (ids, ids)).fetchall()
    out: dict[str, list[Endpoint]] = {}
    for e in _endpoints(rows):
        out.setdefault(e.allocation_id, []).append(e)
    return out


def used_ports(conn: Connection) -> dict[str, tuple[int, int]]:
    """node -> (public ports in use, ports in its ingress range), for every node declaring ingress."""
    with dberrors.wrapped("count ingress ports"):
        rows = conn.execute(
            "SELECT n.name,"
            " (SELECT count(*) FROM allocation_endpoints e WHERE e.node_id = n.id AND e.freed_at IS NULL),"
            " (n.ingress ->> 'port_last')::integer - (n.ingress ->> 'port_first')::integer + 1"
            " FROM nodes n WHERE n.present AND n.ingress IS NOT NULL ORDER BY n.name"
        ).fetchall()
    return {str(n): (int(used), int(size)) for n, used, size in rows}
