"""`gpuaas schema`: print or write the JSON Schemas of the desired-state kinds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("schema", help="print or write JSON Schemas of the desired-state kinds")
    p.add_argument("--write", type=Path, metavar="DIR", help="write <Kind>.schema.json files into DIR")
    p.add_argument("--kind", help="print only this kind")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from desired import jsonschemas

    schemas = jsonschemas.generate()
    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
        for kind, schema in schemas.items():
            (args.write / jsonschemas.filename(kind)).write_text(jsonschemas.render(schema))
            print(f"wrote {args.write / jsonschemas.filename(kind)}")
        return 0
    for kind, schema in schemas.items():
        if args.kind in (None, kind):
            print(jsonschemas.render(schema), end="")
    return 0
