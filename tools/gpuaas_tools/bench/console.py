"""`gpuaas bench console URL --token-file F`: keystroke round trip through a console gateway.

A client of the gateway (reconciler/service/console.py), as a tenant's
terminal is: it opens the WebSocket of one allocation's console, waits until
a shell answers (`echo` of a marker, retried while the guest boots), then
types --keys single characters one at a time and times each until the
guest's terminal echoes it back (client -> gateway -> libvirt stream ->
serial port -> guest tty -> back). Prints p50 and p90 in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

MARKER = "gpuaas-bench-$((6*7))"
ECHOED = b"gpuaas-bench-42"


def register(sub: Any) -> None:
    p = sub.add_parser("console", help="keystroke round trip through the console gateway (a running VM's shell)")
    p.add_argument("url", help="ws://HOST:PORT/api/v1/allocations/ID/console")
    p.add_argument("--token-file", type=Path, required=True, help="the bearer token of a tenant or operator")
    p.add_argument("--keys", type=int, default=50)
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for the shell to answer")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _until(ws: Any, want: bytes, deadline: float) -> bytes:
    seen = b""
    while want not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {want!r} from the console; last bytes {seen[-200:]!r}")
        try:
            seen += ws.recv(timeout=left)
        except TimeoutError:
            continue
    return seen


def run(args: argparse.Namespace) -> int:
    from websockets.sync.client import connect

    token = args.token_file.read_text(encoding="utf-8").strip()
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    with connect(args.url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30) as ws:
        deadline = t0 + args.ready_timeout
        while True:
            ws.send(f"echo {MARKER}\n".encode())
            try:
                _until(ws, ECHOED, min(deadline, time.monotonic() + 3))
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        out["shell_answer_s"] = round(time.monotonic() - t0, 2)
        rtts = []
        for i in range(args.keys):
            key = b"abcdefghijklmnopqrstuvwxyz"[i % 26 : i % 26 + 1]
            sent = time.monotonic()
            ws.send(key)
            _until(ws, key, sent + 10)
            rtts.append((time.monotonic() - sent) * 1000)
        ws.send(b"\x15\n")  # kill the typed line, then an empty command
    out["keys"] = len(rtts)
    out["keystroke_rtt_p50_ms"] = round(statistics.median(rtts), 2)
    out["keystroke_rtt_p90_ms"] = (
        round(statistics.quantiles(rtts, n=10)[-1], 2) if len(rtts) >= 2 else out["keystroke_rtt_p50_ms"]
    )
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:24s} {v}")
    return 0
