"""The dashboard as a browser sees it: headless Chromium loads the page, the test reads its DOM."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reconciler.service import dashboard
from tests.service.conftest import BROKEN_NODE, DRIFT_NODE, DRIFT_SLOT, HTML_MESSAGE, HTML_NODE, Served

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian package `chromium`, in APT_PACKAGES)")


def dump_dom(url: str, profile: Path) -> str:
    """The DOM after load, serialised by the browser (scripts, had there been any, would have run)."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Cells(HTMLParser):
    """Elements with data-state: grid cells (data-node, data-slot) and node-page slot rows (data-slot)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, int], str] = {}
        self.rows: dict[int, str] = {}
        self.grid_nodes: list[str] = []
        self.title = ""
        self._in_title = False
        self.links: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and "data-node" in a:
            self.grid_nodes.append(a["data-node"])
        if "data-state" in a and "data-node" in a:
            self.cells[(a["data-node"], int(a["data-slot"]))] = a["data-state"]
            self.links[f"{a['data-node']}/{a['data-slot']}"] = a.get("href", "")
        elif "data-state" in a and "data-slot" in a:
            self.rows[int(a["data-slot"])] = a["data-state"]
        if tag == "a" and a.get("id") == "next":
            self.links["next"] = a.get("href", "")
        self._in_title = tag == "title"

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False


def _parse(dom: str) -> Cells:
    p = Cells()
    p.feed(dom)
    return p


def test_the_grid_shows_every_node_and_slot_state(served: Served, tmp_path: Path) -> None:
    dom = dump_dom(served.url + "/", tmp_path / "profile")
    page = _parse(dom)
    api_nodes = served.json("/api/v1/nodes")["items"]
    assert page.grid_nodes == [n["name"] for n in api_nodes]
    expected = {(n["name"], s["slot_index"]): s["state"] for n in api_nodes for s in n["slots"]}
    assert page.cells == expected and len(expected) >= 16
    assert page.cells[(DRIFT_NODE, DRIFT_SLOT)] == "drift"
    assert page.cells[(DRIFT_NODE, 0)] == "reserved"  # alloc-0001's slot
    assert {"available", "reserved", "drift"} <= set(page.cells.values())
    assert page.links[f"{DRIFT_NODE}/{DRIFT_SLOT}"] == f"/nodes/{DRIFT_NODE}#slot-{DRIFT_SLOT}"
    assert 'http-equiv="refresh"' in dom
    # Text from hosts is escaped: the drift message shows as text and its script never ran.
    assert page.title == "gpuaas fleet"
    assert "&lt;script&gt;" in dom and "<b>bold</b>" not in dom
    assert "alloc-0007" in dom and "plan.sku_unavailable" in dom  # the pending request and its reason
    assert BROKEN_NODE in dom.split('id="drift"', 1)[1]  # named as an invalid report
    assert "Launchable capacity" in dom and "1g:" in dom


def test_the_node_page_shows_slots_claims_and_drift(served: Served, tmp_path: Path) -> None:
    dom = dump_dom(f"{served.url}/nodes/{DRIFT_NODE}", tmp_path / "profile")
    page = _parse(dom)
    node = served.json(f"/api/v1/nodes/{DRIFT_NODE}")
    assert page.rows == {s["slot_index"]: s["state"] for s in node["slots"]}
    assert "alloc-0001" in dom and "drift.disk.signature_present" in dom and "vm provisioning" in dom
    assert 'id="reboot-required"' in dom and "bootstrap reboot_required" in dom and "agent 0.1.0" in dom
    broken = dump_dom(f"{served.url}/nodes/{BROKEN_NODE}", tmp_path / "profile")
    assert 'id="drift-invalid"' in broken
    html = dump_dom(f"{served.url}/nodes/{HTML_NODE}", tmp_path / "profile")
    assert HTML_MESSAGE.replace("<", "&lt;").replace(">", "&gt;") in html and _parse(html).title.startswith(HTML_NODE)
    missing = dump_dom(f"{served.url}/nodes/nope", tmp_path / "profile")
    assert "api.not_found" in missing


def test_the_grid_pages_through_the_fleet(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "PAGE_SIZE", 3)
    names = [n["name"] for n in served.json("/api/v1/nodes")["items"]]
    first = _parse(dump_dom(served.url + "/", tmp_path / "profile"))
    assert first.grid_nodes == names[:3] and first.links["next"] == "/?page=2"
    second = _parse(dump_dom(served.url + first.links["next"], tmp_path / "profile"))
    assert second.grid_nodes == names[3:6]
    only_drift = _parse(dump_dom(served.url + "/?state=drift", tmp_path / "profile"))
    assert only_drift.grid_nodes == [DRIFT_NODE]
    region = _parse(dump_dom(served.url + "/?region=eu-west-1", tmp_path / "profile"))
    assert region.grid_nodes == [n for n in names if "euw1" in n]
