"""The dashboard as a place to act, read in headless Chromium: search across nodes, allocations and tenants,
the failed and stuck allocations with reason, attempts and what the host said, retries collapsed (issue 34).

On the served example fleet (tests/service/conftest.py), alloc-0001 (tenant acme-research) then fails on its
node: its host reports a permanent, node-independent error (an SSH key it cannot use), and the revision is
applied three more times (nothing changes: three `unchanged` rows, one line on the page).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from reconciler import cli
from reconciler.service import lookups
from reconciler.store import connections
from tests.claims.test_lifecycle import report_vm_failure, where
from tests.service.conftest import EXAMPLE, Served, serve
from tests.service.test_dashboard import CHROMIUM, dump_dom

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian package `chromium`, in APT_PACKAGES)")
FAILED = "alloc-0001"
SAID = "key 0 is not an SSH key"


@pytest.fixture
def acted(fleet_url: str, capsys: pytest.CaptureFixture[str]) -> Iterator[Served]:
    with connections.connect(fleet_url, autocommit=True) as conn:
        node, slots = where(conn, FAILED)
        assert node is not None
        report_vm_failure(conn, node, slots, FAILED, "cloud_init_seed", "host.seed.ssh_key", SAID)
    for _ in range(4):
        assert cli.main(["apply", str(EXAMPLE), "--db-url", fleet_url]) == 0
    capsys.readouterr()
    yield from serve(fleet_url)


def _rows(dom: str, attr: str) -> dict[str, str]:
    """`<tr {attr}="KEY" ...>...</tr>` -> the row's text, tags stripped."""
    out = {}
    for m in re.finditer(rf'<tr {attr}="([^"]+)"[^>]*>(.*?)</tr>', dom, re.S):
        out[m.group(1)] = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m.group(2))).strip()
    return out


def test_the_failed_allocation_is_listed_with_reason_attempts_and_the_hosts_words(
    acted: Served, tmp_path: Path
) -> None:
    dom = dump_dom(acted.url + "/", tmp_path / "profile")
    row = _rows(dom, "data-troubled")[FAILED]
    assert "failed" in row and "acme-research" in row and "lifecycle.provision_failed" in row
    assert f"host.seed.ssh_key in cloud_init_seed: {SAID}" in row
    assert re.search(r"\b1\b", row.split("lifecycle.provision_failed")[1])  # one attempt
    assert 'href="#troubled"' in dom  # the header's failed count leads to the list

    history = re.findall(r'<tr data-history="\d+" data-repeats="(\d+)"', dom)
    assert "3" in history or "4" in history  # the unchanged re-applies: one row, counted
    assert "\u00d7" in dom or "&times;" in dom  # the multiplication sign before the count

    page = dump_dom(acted.url + f"/allocations/{FAILED}", tmp_path / "profile2")
    assert 'id="failure"' in page and "lifecycle.provision_failed" in page and SAID in page


def test_search_finds_nodes_allocations_and_tenants(acted: Served, tmp_path: Path) -> None:
    dom = dump_dom(acted.url + "/?q=USE1-S0", tmp_path / "p1")  # case-insensitive, part of a name
    nodes = re.findall(r'<a href="/nodes/([^"]+)">', dom.split('id="found-nodes"')[1].split("</table>")[0])
    assert nodes == ["h200-use1-s01", "h200-use1-s02"]

    dom = dump_dom(acted.url + "/?q=acme", tmp_path / "p2")
    tenants = dom.split('id="found-tenants"')[1].split("</table>")[0]
    assert "acme-research" in tenants
    found = set(_rows(dom, "data-allocation"))
    assert {"alloc-0001", "alloc-0004"} <= found and "alloc-0002" not in found

    dom = dump_dom(acted.url + "/?tenant=" + quote("globex"), tmp_path / "p3")
    globex = {f.stem for f in (EXAMPLE / "allocations").glob("*.yaml") if "tenant: globex\n" in f.read_text()}
    assert len(globex) >= 2 and set(_rows(dom, "data-allocation")) == globex

    dom = dump_dom(acted.url + "/?q=" + quote("100%_"), tmp_path / "p4")  # % and _ are literal
    assert "no allocation matches" in dom


def test_retries_fold_into_one_row_but_changes_do_not() -> None:
    def row(i: int, result: str, error: str | None = None) -> dict[str, object]:
        return {
            "id": i,
            "revision": "abc",
            "result": result,
            "source": "retry local /repo",
            "started_at": i,
            "errors": [{"code": error}] if error else [],
        }

    rows = [
        row(9, "error", "x"),
        row(8, "error", "x"),
        row(7, "error", "x"),
        row(6, "error", "y"),
        row(5, "changed"),
        row(4, "changed"),
    ]
    folded = lookups.collapsed(rows)
    assert [(r["id"], r["repeats"]) for r in folded] == [(9, 3), (6, 1), (5, 1), (4, 1)]
    assert folded[0]["first_started_at"] == 7


def test_the_summary_summed_from_the_overview_is_the_summary(fleet_url: str) -> None:
    from reconciler.service import reads

    with connections.connect(fleet_url, autocommit=True) as conn:
        assert reads.fleet_summary(conn, overview=reads.regions(conn)) == reads.fleet_summary(conn)
