"""The host's database client: read this node's plan, write this node's status (PostgreSQL, direct mode).

A host connects as its own node role (`gpuaas_create_node_role`, migration
0050); row-level security makes `host_plans`, `host_status` and
`host_slot_status` show and accept only that node's rows, so a host cannot
read another node's plan or write another node's status even if its code
asked to. The central reconciler (table owner) reads every node's status
through its own store (reconciler/store/hoststatus.py).

psycopg errors become project errors here (`schemas.dberrors`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from host_reconciler import codes as host_codes
from host_reconciler.statuses import HostStatus
from schemas import dberrors, hostplans, hostrows
from schemas.errors import PermanentError


@dataclass(frozen=True, slots=True)
class NodeCredentials:
    node: str
    role: str
    password: str


def connect(
    url: str, *, role: str | None = None, password: str | None = None, autocommit: bool = True
) -> psycopg.Connection[Any]:
    kwargs: dict[str, Any] = {"application_name": "gpuaas-host", "connect_timeout": 10}
    if role is not None:
        kwargs["user"] = role
    if password is not None:
        kwargs["password"] = password
    with dberrors.wrapped("connect to PostgreSQL"):
        return psycopg.connect(url, autocommit=autocommit, **kwargs)


def create_node_role(conn: psycopg.Connection[Any], node: str, password: str) -> NodeCredentials:
    """Create (or re-key) the login role of `node` (run as the central reconciler's role)."""
    with dberrors.wrapped(f"create the role of node {node}"):
        row = conn.execute("SELECT gpuaas_create_node_role(%s, %s)", (node, password)).fetchone()
    if row is None:
        raise PermanentError(f"no role created for {node}", code=host_codes.STORE_ROLE)
    return NodeCredentials(node, str(row[0]), password)


def read_plan(conn: psycopg.Connection[Any], node: str) -> hostplans.HostPlan | None:
    """This node's plan, or None when the central reconciler wrote none (or RLS hides it)."""
    with dberrors.wrapped(f"read the host plan of {node}"):
        row = conn.execute("SELECT generation, spec FROM host_plans WHERE node_name = %s", (node,)).fetchone()
    if row is None:
        return None
    generation, spec = row
    doc = dict(spec if isinstance(spec, dict) else json.loads(spec))
    doc["generation"] = int(generation)
    doc.setdefault("node", node)
    try:
        plan = hostplans.from_json(doc)
    except (TypeError, KeyError, ValueError) as e:
        raise PermanentError(f"host plan of {node} does not decode: {e}", code=host_codes.PLAN_INVALID) from e
    if plan.node != node:
        raise PermanentError(f"host plan row of {node} names node {plan.node}", code=host_codes.PLAN_WRONG_NODE)
    return plan


def write_status(conn: psycopg.Connection[Any], status: HostStatus) -> bool:
    """Write the node row and every slot row of `status` in one transaction (schemas/hostrows.py).

    False: a newer report is stored already; nothing was written.
    """
    return hostrows.write_status(conn, status.as_dict())


def read_image_cache(conn: psycopg.Connection[Any], node: str) -> list[dict[str, Any]]:
    """This node's reported cache rows (what the central reconciler sees)."""
    with dberrors.wrapped(f"read the image cache of {node}"):
        rows = conn.execute(
            "SELECT digest_sha256, size_bytes, last_used_at FROM node_image_cache WHERE node_name = %s"
            " ORDER BY digest_sha256",
            (node,),
        ).fetchall()
    return [{"digest": r[0], "size_bytes": r[1], "last_used_at": r[2]} for r in rows]


def heartbeat(conn: psycopg.Connection[Any], node: str) -> None:
    """Say this host agent is alive (host_status.reported_at = now), without touching its last report."""
    hostrows.heartbeat(conn, [node])


def read_rewipes(conn: psycopg.Connection[Any], node: str) -> list[tuple[int, int]]:
    """This node's pending rewipe requests (`gpuaas slot rewipe`, migration 0054): (request id, slot)."""
    with dberrors.wrapped(f"read the rewipe requests of {node}"):
        rows = conn.execute(
            "SELECT id, slot_index FROM slot_rewipe_requests WHERE node_name = %s AND state = 'pending' ORDER BY id",
            (node,),
        ).fetchall()
    return [(int(r[0]), int(r[1])) for r in rows]


def answer_rewipe(conn: psycopg.Connection[Any], request_id: int, state: str, answer: dict[str, Any]) -> None:
    """Answer one request (accepted | refused); RLS lets a node answer only its own."""
    with dberrors.wrapped(f"answer rewipe request {request_id}"):
        conn.execute(
            "UPDATE slot_rewipe_requests SET state = %s, answered_at = now(), answer = %s"
            " WHERE id = %s AND state = 'pending'",
            (state, Jsonb(answer), request_id),
        )
