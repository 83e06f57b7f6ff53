"""`gpuaas explain [KIND[.field[.sub]]] [-o text|json|yaml]`: what a desired-state field means.

kubectl's `explain`, read from the same JSON Schemas editors use
(`desired.jsonschemas.generate()`: the models plus the formats, rules and
descriptions the schema adds), so the help cannot disagree with the schema.
A path walks through lists and maps to their elements
(`SlotMap.slots.nvme_identity`: `slots` is a list of Slot). Without a KIND,
the kinds are listed.

Printed for the kind or field: its type, whether it is required, its default,
its allowed values and other constraints (pattern, range, sizes), its
description, and for an object its fields. An unknown kind or field is
`explain.unknown_kind` / `explain.unknown_field`, naming the closest names.
"""

from __future__ import annotations

import argparse
import difflib
import textwrap
from typing import Any

from reconciler import codes as reconciler_codes
from schemas import output
from schemas.errors import UsageError

UNKNOWN_KIND = reconciler_codes.EXPLAIN_UNKNOWN_KIND
UNKNOWN_FIELD = reconciler_codes.EXPLAIN_UNKNOWN_FIELD
# Schema keywords shown as constraints, in this order (enum and const are the allowed values).
CONSTRAINTS = (
    "pattern",
    "format",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "propertyNames",
)
Schema = dict[str, Any]


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="type, default, allowed values and meaning of a kind or field (kubectl-style)")
    p.add_argument(
        "path",
        nargs="?",
        metavar="KIND[.field[.sub]]",
        help="e.g. Sku, Sku.capacity_shape, SlotMap.slots.nvme_device (none: list kinds)",
    )
    output.add_argument(p, "text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from desired import jsonschemas

    schemas = jsonschemas.generate()
    doc = kinds(schemas) if args.path is None else explain(schemas, args.path)
    if output.structured(args.output):
        output.emit(doc, args.output)
    else:
        print(render_kinds(doc) if args.path is None else render_text(doc))
    return 0


# -- the pure part: schemas in, an explanation out -------------------------------------------


def kinds(schemas: dict[str, Schema]) -> dict[str, Any]:
    return {"kinds": [{"kind": kind, "description": _kind_description(kind, s)} for kind, s in schemas.items()]}


def explain(schemas: dict[str, Schema], path: str) -> dict[str, Any]:
    """The explanation of `Kind.field.sub`; UsageError naming close names when a part is unknown."""
    kind_name, *fields = path.split(".")
    kind = _find_kind(schemas, kind_name)
    root = schemas[kind]
    defs: dict[str, Schema] = root.get("$defs", {})
    node: Schema = root
    required = True
    walked: list[str] = []
    for name in fields:
        where = ".".join([kind, *walked])
        obj = _object(node, defs)
        if obj is None:
            raise UsageError(f"{where} is {_type(node, defs)}: it has no field {name!r}", code=UNKNOWN_FIELD)
        props: dict[str, Schema] = obj["properties"]
        if name not in props:
            close = difflib.get_close_matches(name, list(props), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"fields: {', '.join(sorted(props))}"
            raise UsageError(f"{where} has no field {name!r}; {hint}", code=UNKNOWN_FIELD)
        required = name in obj.get("required", ())
        node = props[name]
        walked.append(name)
    doc: dict[str, Any] = {
        "kind": kind,
        "field": ".".join(walked) or None,
        "type": _type(node, defs),
        "required": required,
    }
    if "default" in node:
        doc["default"] = node["default"]
    allowed = _allowed(node, defs)
    if allowed is not None:
        doc["allowed"] = allowed
    constraints = _constraints(node, defs)
    if constraints:
        doc["constraints"] = constraints
    doc["description"] = _kind_description(kind, root) if not walked else node.get("description", "")
    obj = _object(node, defs)
    if obj is not None and obj.get("properties"):
        need = set(obj.get("required", ()))
        doc["fields"] = [
            {"name": n, "type": _type(p, defs), "required": n in need, "description": p.get("description", "")}
            for n, p in obj["properties"].items()
        ]
    return doc


def _find_kind(schemas: dict[str, Schema], name: str) -> str:
    by_lower = {k.lower(): k for k in schemas}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(by_lower[c] for c in close)}?" if close else f"kinds: {', '.join(schemas)}"
    raise UsageError(f"no kind {name!r}; {hint}", code=UNKNOWN_KIND)


def _kind_description(kind: str, root: Schema) -> str:
    """The `kind` field's help reads "Always Sku: a product sold to tenants."; the kind's is what follows."""
    text = str(root.get("properties", {}).get("kind", {}).get("description", ""))
    text = text.removeprefix(f"Always {kind}: ")
    return text[:1].upper() + text[1:]


def _deref(node: Schema, defs: dict[str, Schema]) -> Schema:
    while "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _branches(node: Schema, defs: dict[str, Schema]) -> list[Schema]:
    """The non-null alternatives of a field (an optional field is `anyOf: [X, null]`)."""
    node = _deref(node, defs)
    if "anyOf" in node:
        return [_deref(b, defs) for b in node["anyOf"] if b.get("type") != "null"]
    return [node]


def _element(node: Schema, defs: dict[str, Schema]) -> Schema | None:
    """What a list or map holds, None for anything else."""
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        return _deref(node["items"], defs)
    if node.get("type") == "object" and not node.get("properties"):
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return _deref(values, defs)
        patterns = list(node.get("patternProperties", {}).values())
        if len(patterns) == 1:
            return _deref(patterns[0], defs)
    return None


def _object(node: Schema, defs: dict[str, Schema]) -> Schema | None:
    """The object with properties a path goes on into: the field itself, or its list's or map's element."""
    branches = _branches(node, defs)
    if len(branches) != 1:
        return None
    current: Schema | None = branches[0]
    while current is not None:
        if current.get("properties"):
            return current
        current = _element(current, defs)
        if current is not None:
            inner = _branches(current, defs)
            current = inner[0] if len(inner) == 1 else None
    return None


def _type(node: Schema, defs: dict[str, Schema]) -> str:
    """`string`, `[]Slot`, `map[string]VmProfile`, `string (date-time)`..."""
    names = []
    for b in _branches(node, defs):
        element = _element(b, defs)
        if element is not None:
            name = ("[]" if b.get("type") == "array" else "map[string]") + _type(element, defs)
        elif b.get("properties"):
            name = str(b.get("title", "object"))
        else:
            name = str(b.get("type", "any"))
            if "format" in b:
                name += f" ({b['format']})"
        if name not in names:
            names.append(name)
    return " | ".join(names) or "any"


def _allowed(node: Schema, defs: dict[str, Schema]) -> list[Any] | None:
    values: list[Any] = []
    for b in _branches(node, defs):
        if "const" in b:
            values.append(b["const"])
        values += b.get("enum", [])
        if b.get("type") == "array" and isinstance(b.get("items"), dict):
            values += _deref(b["items"], defs).get("enum", [])  # a list of enum values: allowed per item
    return values or None


def _constraints(node: Schema, defs: dict[str, Schema]) -> dict[str, Any]:
    """Schema keywords that limit the value; alternatives (an IPv4 or an IPv6 address) list each value."""
    found: dict[str, list[Any]] = {}
    for b in _branches(node, defs):
        limits = {k: b[k] for k in CONSTRAINTS if k in b}
        if "propertyNames" in limits:  # map keys, like workload_mix's GPU counts
            limits["key_pattern"] = limits.pop("propertyNames").get("pattern")
        items = _deref(b["items"], defs) if b.get("type") == "array" and isinstance(b.get("items"), dict) else {}
        if "pattern" in items:  # a list of strings, like ssh_keys
            limits["item_pattern"] = items["pattern"]
        for key, value in limits.items():
            if value is not None and value not in found.setdefault(key, []):
                found[key].append(value)
    return {k: v[0] if len(v) == 1 else v for k, v in found.items()}


# -- text ------------------------------------------------------------------------------------


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=100, initial_indent=indent, subsequent_indent=indent) or [indent.rstrip()]


def render_text(doc: dict[str, Any]) -> str:
    import json  # values print as the YAML/JSON a user would write them

    def line(label: str, value: Any) -> None:
        out.append(f"{label.replace('_', ' ').upper() + ':':<14}{value}")

    out: list[str] = []
    line("kind", doc["kind"])
    if doc["field"]:
        line("field", doc["field"])
    line("type", doc["type"])
    if doc["field"]:
        line("required", "yes" if doc["required"] else "no")
    if "default" in doc:
        line("default", json.dumps(doc["default"]))
    if "allowed" in doc:
        line("allowed", ", ".join(v if isinstance(v, str) else json.dumps(v) for v in doc["allowed"]))
    for key, value in doc.get("constraints", {}).items():
        line(key, " or ".join(map(str, value)) if isinstance(value, list) else value)
    out += ["", "DESCRIPTION:", *_wrap(doc["description"] or "(none)", "    ")]
    if doc.get("fields"):
        out += ["", "FIELDS:"]
        for f in doc["fields"]:
            out.append(f"  {f['name']}  <{f['type']}>" + ("  -required-" if f["required"] else ""))
            out += _wrap(f["description"], "      ")
    return "\n".join(out)


def render_kinds(doc: dict[str, Any]) -> str:
    width = max(len(k["kind"]) for k in doc["kinds"])
    lines = [f"{k['kind']:<{width}}  {k['description']}" for k in doc["kinds"]]
    return "\n".join([*lines, "", "gpuaas explain KIND[.field] for a kind's fields"])
