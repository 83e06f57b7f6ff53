"""Progress of long work (schemas/progress.py): live on a terminal, periodic plain or JSON lines otherwise (issue 34).

The terminal case runs `gpuaas fleet synth` with its stderr on a real pseudo-terminal (`pty`).
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from reconciler.commands import apply
from schemas import progress

ROOT = Path(__file__).resolve().parents[1]
SYNTH = [sys.executable, "-m", "reconciler.cli", "fleet", "synth", "--nodes", "150", "--out"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def test_on_a_terminal_one_line_is_redrawn_with_counts_and_rate(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    try:
        # 800 nodes: a write phase of most of a second, so redraws catch it part way on a fast machine too.
        cmd = [*SYNTH[:-3], "--nodes", "800", "--out", str(tmp_path / "fleet")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave, env=_env())
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=300) == 0
    finally:
        os.close(master)
    seen = b"".join(chunks).decode()
    assert "\r\x1b[K" in seen  # redrawn in place
    assert "fleet synth: write" in seen and "/1,605 files" in seen and "/s)" in seen


def test_on_a_terminal_a_phase_is_drawn_as_it_starts_however_short() -> None:
    out = io.StringIO()
    with progress.Progress(out, style="tty", title="validate") as shown:
        with shown.phase("parse files", 805, unit="files") as ph:
            ph.advance(805)  # over before the first redraw tick
        with shown.phase("validate documents", 804, unit="documents"):
            pass
    seen = out.getvalue()
    assert seen.startswith("\r\x1b[Kvalidate: parse files 0/805 files 0.0 s")
    assert "\r\x1b[Kvalidate: validate documents 0/804 documents 0.0 s" in seen
    assert seen.endswith("\r\x1b[K")  # nothing left behind for phases under a second


def test_piped_it_prints_plain_periodic_lines(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SYNTH, str(tmp_path / "fleet")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(GPUAAS_PROGRESS_INTERVAL="0.05"),
        check=True,
    )
    lines = done.stderr.splitlines()
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    assert lines and all(line.startswith("fleet synth: write ") for line in lines)
    assert lines[-1].startswith("fleet synth: write 305/305 files") and lines[-1].endswith(" done")
    assert done.stdout.startswith("wrote 305 files")  # stdout keeps the command's own output


def test_json_lines_with_progress_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [*SYNTH, str(tmp_path / "fleet"), "--progress", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(GPUAAS_PROGRESS_INTERVAL="0.05"),
        check=True,
    )
    docs = [json.loads(line) for line in done.stderr.splitlines()]
    assert docs[-1]["final"] and docs[-1]["done"] == docs[-1]["total"] == 305
    assert {d["event"] for d in docs} == {"progress"} and docs[-1]["command"] == "fleet synth"


def test_a_short_run_that_is_not_on_a_terminal_stays_silent() -> None:
    stream = io.StringIO()
    with progress.Progress(stream, style="auto", interval=10.0) as shown:
        for _ in shown.iterate("count", range(1000), 1000):
            pass
    assert stream.getvalue() == ""


def _doc(plans: int) -> dict[str, object]:
    return {
        "revision": "abc",
        "inventory": [],
        "freed": [],
        "placements": [],
        "pending": [],
        "releases": [],
        "cancelled": [],
        "changed": True,
        "host_plans": [{"node": f"node-{i:05d}", "generation": 1} for i in range(plans)],
    }


def test_apply_summarises_host_plans_and_lists_them_with_verbose() -> None:
    text = apply.render_text(_doc(10_000))
    assert "10,000 host plans written" in text and "node-00042" not in text
    assert len(text) < 200  # not one 150,000-character line
    verbose = apply.render_text(_doc(10_000), verbose=True).splitlines()
    assert "  node-00042@1" in verbose


def test_image_pulls_count_mib() -> None:
    shown = progress.Progress(io.StringIO(), style="plain", title="image pull")
    ph = progress.Phase("fetch", 4 << 30, done=1 << 30, started=0.0, unit="bytes")
    text = shown.line_text(ph, final=False)
    assert text.startswith("image pull: fetch 1,024.0/4,096.0 MiB (") and " MiB/s)" in text
