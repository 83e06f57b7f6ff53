"""The whole slot claim snapshot codec (schemas.snapshots) against the SQL that writes the snapshot.

PostgreSQL builds a slot claim's `resource_snapshot` as `to_jsonb` of the
composite type gpuaas_slot_claim_snapshot (schemas/sql/0006); the codec's
dataclasses mirror those types. These tests read the types from the catalog
and decode what the server actually wrote, so a migration that adds, drops,
renames or retypes a snapshot field fails here, not on a host.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest

from desired.state import DesiredState
from reconciler.store import claims, hostplans
from reconciler.store.connections import Connection
from schemas import snapshots
from schemas.errors import PermanentError
from tests.claims.test_apply import slice_placement

NODE = "node-00000"

# What each SQL type becomes in the codec (jsonb: the profile the apply passed, or a nested object).
_SQL_TO_PY: dict[str, set[Any]] = {
    "text": {str},
    "integer": {int},
    "timestamp with time zone": {str},  # to_jsonb writes ISO 8601 text
    "text[]": {tuple[str, ...]},
    "jsonb": {snapshots.Profile, snapshots.SnapshotImage},
}


def _attributes(conn: Connection, type_name: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(sql_type))
        for name, sql_type in conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " JOIN pg_type t ON t.typrelid = a.attrelid WHERE t.typname = %s AND a.attnum > 0"
            " AND NOT a.attisdropped ORDER BY a.attnum",
            (type_name,),
        ).fetchall()
    ]


def _py_types(hint: Any) -> set[Any]:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return {a for a in args if a is not type(None)}


@pytest.mark.parametrize("type_name", sorted(snapshots.SQL_TYPES))
def test_each_codec_type_is_its_composite_type_field_for_field(conn: Connection, type_name: str) -> None:
    cls = snapshots.SQL_TYPES[type_name]
    columns = _attributes(conn, type_name)
    assert columns, f"{type_name} is not in the catalog"
    assert [name for name, _ in columns] == [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    by_class = {v: k for k, v in snapshots.SQL_TYPES.items()}
    for name, sql_type in columns:
        wanted = {by_class.get(t, t) for t in _py_types(hints[name])}
        allowed = _SQL_TO_PY.get(sql_type, {sql_type})  # a composite type: its own dataclass
        assert wanted <= {by_class.get(t, t) for t in allowed}, (type_name, name, sql_type, wanted)


def _snapshot(conn: Connection, alloc: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT resource_snapshot FROM allocation_resource_claims WHERE allocation_id = %s ORDER BY slot_index",
        (alloc,),
    ).fetchone()
    assert row is not None
    return dict(row[0])


def test_what_the_placement_sql_writes_decodes_and_encodes_back_byte_for_byte(
    conn: Connection, fleet: DesiredState
) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (2,))).placed
    doc = _snapshot(conn, "alloc-0000000")
    snap = snapshots.slot_claim_from_json(doc)
    assert snapshots.slot_claim_to_json(snap) == doc
    slot = conn.execute(
        "SELECT slot_index, gpu_pci_address, mac_address, host(private_ip), numa_node, nvme_device"
        " FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id WHERE n.name = %s AND slot_index = 2",
        (NODE,),
    ).fetchone()
    assert slot is not None
    assert (
        snap.slot.slot_index,
        snap.slot.gpu_pci_address,
        snap.slot.mac_address,
        snap.slot.private_ip,
        snap.slot.numa_node,
        snap.slot.nvme_device,
    ) == tuple(slot)
    assert snap.node == NODE and snap.allocation_id == "alloc-0000000" and snap.profile is not None
    assert snap.image is not None and snap.price is not None and snap.gpus == 1
    (vm,) = hostplans.build(conn, NODE).vms  # type: ignore[union-attr]
    assert vm.bundles[0].mac_address == snap.slot.mac_address and vm.ssh_keys == snap.ssh_keys


def _corrupt(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = dict(doc)
    if len(path) == 1:
        if value is KeyError:
            del out[path[0]]
        else:
            out[path[0]] = value
        return out
    out[path[0]] = _corrupt(dict(out[path[0]]), path[1:], value)
    return out


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        (("slot", "mac_address"), KeyError, snapshots.CLAIM_MISSING_KEY),
        (("tenant",), KeyError, snapshots.CLAIM_MISSING_KEY),
        (("slot", "pci_bus"), "0000:00:00.0", snapshots.CLAIM_UNKNOWN_KEY),
        (("slot", "numa_node"), "0", snapshots.CLAIM_BAD_VALUE),
        (("ssh_keys",), "ssh-ed25519 AAAA", snapshots.CLAIM_BAD_VALUE),
        (("image", "slug"), None, snapshots.CLAIM_BAD_VALUE),
        (("slot",), None, snapshots.CLAIM_NOT_AN_OBJECT),
        (("price",), [], snapshots.CLAIM_NOT_AN_OBJECT),
        (("profile", "vcpu_count"), True, snapshots.BAD_VALUE),
    ],
)
def test_a_snapshot_that_is_not_exactly_the_sql_shape_is_refused_with_its_code(
    conn: Connection, fleet: DesiredState, path: tuple[str, ...], value: Any, code: str
) -> None:
    assert claims.place(conn, slice_placement("alloc-0000001", NODE, (3,))).placed
    doc = _corrupt(_snapshot(conn, "alloc-0000001"), path, value)
    with pytest.raises(PermanentError) as refused:
        snapshots.slot_claim_from_json(doc, where="claim c-1 (alloc-0000001)")
    assert refused.value.code == code and "alloc-0000001" in refused.value.message
