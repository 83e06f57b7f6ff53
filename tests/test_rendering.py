"""Hostile values in markdown output, parsed back with a real CommonMark renderer (markdown-it-py).

Every value a renderer did not write itself (names and file names from git,
revisions, host drift reports) goes through `schemas.rendering`. Each test
renders a PR plan or a drift report whose every value is one hostile string
and checks the token stream, not the text:

- no `html_inline` token at all, and `html_block` tokens only of the
  document's own structure (the plan marker, `<details>` open and close);
- `<details>` blocks balanced, never nested, and the same HTML element
  structure as the document rendered with a harmless value;
- every table row splits (GFM rules: `\\` escapes, `|` splits, code spans
  included) into exactly the header's column count, and the cells hold only
  text and code spans;
- the hostile value comes back, as text, intact in its cell.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from desired import problems as p
from policies.profiles import Profile
from reconciler import plans
from reconciler.placement import inventory_diff, prplan_render, prplan_summary
from reconciler.placement.prplan import Affected, NodeChange, PrPlan
from schemas import driftreports, rendering

MD = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])

HOSTILE = [
    "<img src=//evil.invalid/p.png></details>",
    "<script>alert(1)</script>",
    "a|b",
    "x\\|y",
    "ends with a backslash\\",
    "`code` and ``more`` `",
    "*bold* _em_ __strong__ [link](http://evil.invalid) ![i](x.png)",
    "line1\nline2\r\n| fake | row |",
    "</details>\n\n<details open><summary>forged</summary>",
    "&lt;entity&gt; &amp; &#60;b&#62;",
    "tab\there\x1b[31mred\x00nul\u202eevil",
    "# heading",
    "1. list",
    "- item",
    "> quote",
    "~~strike~~ $x^2$",
    "<!-- comment -->",
    "<http://evil.invalid/>",
    "h200-use1-s01",
]
IDS = [f"v{i}" for i in range(len(HOSTILE))]

OUR_HTML = re.compile(
    r"^(<!-- gpuaas-plan -->|<details( open)?><summary><b>[A-Za-z :(),]+</b> \(\d+\)</summary>|</details>)\n?$"
)


def raw_cells(line: str) -> list[str]:
    """A GFM table line split the way GFM splits it: `\\x` is one escaped char, every other `|` splits."""
    cells, cur, i = [], "", 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            cur += line[i : i + 2]
            i += 2
            continue
        if line[i] == "|":
            cells.append(cur)
            cur = ""
        else:
            cur += line[i]
        i += 1
    cells.append(cur)
    return cells[1:-1]  # the leading and trailing pipes


def plain(inline: Token) -> tuple[str, set[str]]:
    """The text a reader sees in an inline token, and the token types inside it."""
    kids = inline.children or []
    return "".join(k.content for k in kids), {k.type for k in kids}


def tables(tokens: list[Token]) -> list[list[list[str]]]:
    """Every table as rows (header first) of plain cell texts; asserts cells hold only text and code."""
    out: list[list[list[str]]] = []
    row: list[str] = []
    in_cell = False
    for t in tokens:
        if t.type == "table_open":
            out.append([])
        elif t.type == "tr_open":
            row = []
        elif t.type == "tr_close":
            out[-1].append(row)
        elif t.type in ("th_open", "td_open"):
            in_cell = True
        elif t.type in ("th_close", "td_close"):
            in_cell = False
        elif t.type == "inline" and in_cell:
            text, kinds = plain(t)
            assert kinds <= {"text", "code_inline"}, (kinds, t.content)
            row.append(text)
    return out


_TAG = re.compile(r"<(/?[a-z][a-z0-9]*)")


def tag_sequence(text: str) -> list[str]:
    """The HTML tags the document renders to, in order (code spans left out: plain values get them)."""
    return [t for t in _TAG.findall(MD.render(text)) if t not in ("code", "/code")]


def check_document(text: str, benign: str) -> list[list[list[str]]]:
    """The structural checks every rendered document must pass; returns its tables.

    `benign` is the same document rendered with a harmless value: the hostile
    one must render to exactly the same HTML element structure.
    """
    tokens = MD.parse(text)
    inline_html = [k.content for t in tokens if t.type == "inline" for k in t.children or [] if k.type == "html_inline"]
    assert inline_html == []
    blocks = [t.content for t in tokens if t.type == "html_block"]
    assert all(OUR_HTML.match(b) for b in blocks), blocks
    depth = 0
    for t in tokens:
        if t.type == "html_block" and t.content.startswith("<details"):
            assert depth == 0
            depth += 1
        elif t.type == "html_block" and t.content.startswith("</details>"):
            assert depth == 1
            depth -= 1
    assert depth == 0
    lines = text.splitlines()
    for t in tokens:
        if t.type == "table_open":
            assert t.map is not None
            start, end = t.map
            width = len(raw_cells(lines[start]))
            assert all(len(raw_cells(line)) == width for line in lines[start:end]), lines[start:end]
    assert tag_sequence(text) == tag_sequence(benign)
    return tables(tokens)


# ------------------------------------------------------------------ the functions


def _probe(fn: Callable[[object], rendering.Markdown], value: str) -> str:
    return "\n".join(
        [
            "| a | b |",
            "| --- | --- |",
            rendering.md_row([fn(value), "after"]),
            "",
            "before " + fn(value) + " after",
            "",
            fn(value),
            "",
        ]
    )


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
@pytest.mark.parametrize("fn", [rendering.md_text, rendering.md_code], ids=["md_text", "md_code"])
def test_a_value_renders_as_itself_in_a_cell_and_in_a_paragraph(
    value: str, fn: Callable[[object], rendering.Markdown]
) -> None:
    seen = rendering.one_line(value)
    doc = _probe(fn, value)
    assert check_document(doc, _probe(fn, "x")) == [[["a", "b"], [seen, "after"]]]
    paragraphs = [t for t in MD.parse(doc) if t.type == "inline"][4:]
    assert [plain(t)[0] for t in paragraphs] == [f"before {seen} after", seen]
    assert all(plain(t)[1] <= {"text", "code_inline"} for t in paragraphs)


def test_plain_names_stay_code_spans_and_the_rest_falls_back_to_text() -> None:
    assert rendering.md_code("drift.disk.mounted") == "`drift.disk.mounted`"
    assert rendering.md_code("allocations/req-1.yaml:6:1") == "`allocations/req-1.yaml:6:1`"
    assert rendering.md_code("a`b") == "a\\`b"
    assert rendering.md_text("a|b") == "a\\|b"


def test_html_and_terminal_text() -> None:
    assert rendering.html_text('<b a="1">&\'') == "&lt;b a=&quot;1&quot;&gt;&amp;&#x27;"
    assert rendering.terminal_text("a\nb\x1b[2Jc\u202e") == "a b\\x1b[2Jc\\u202e"


# ------------------------------------------------------------------ the PR plan


def hostile_plan(v: str) -> PrPlan:
    profile = Profile("<img src=//evil.invalid/p.png></details>", 1, 24, 65536)
    inv = inventory_diff.InventoryDiff(
        changes=(inventory_diff.DocumentChange("SlotMap", v, "added", (v, "enabled")),),
        slots=(inventory_diff.SlotChange(v, 0, False, True, (v,)),),
        schedulable_gpus_before=0,
        schedulable_gpus_after=1,
        ineligible_after={v: {1: (v, v)}},
    )
    placement = plans.Placement(v, v, v, "gpu_slice", 1, v, v, (0,), profile, v)
    plan = plans.Plan(placements=(placement,), pending=(plans.Pending(v, v, v),), releases=(plans.Release(v, v, (1,)),))
    return PrPlan(
        v,
        v,
        False,
        inventory=inv,
        nodes=(NodeChange(v, "slice_capable", v, None, v, (v,)),),
        plan=plan,
        orphaned=(v, v),
        affected=(Affected(v, v, v, (0,), v),),
        tenants={v: v},
    )


def _rows(tabs: list[list[list[str]]], *header: str) -> list[list[str]]:
    found = [t for t in tabs if t[0] == list(header)]
    assert len(found) == 1, header
    return found[0][1:]


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_pr_plan_markdown_keeps_its_structure_with_hostile_values(value: str) -> None:
    seen = rendering.one_line(value)
    md = prplan_render.render_markdown(hostile_plan(value))
    tabs = check_document(md, prplan_render.render_markdown(hostile_plan("x")))
    details = [t.content for t in MD.parse(md) if t.type == "html_block" and t.content.startswith("<details")]
    # inventory, slots, still not schedulable, nodes, running allocations affected, placements, pending, releases
    assert len(details) == 8
    assert _rows(tabs, "", "Kind", "Name", "Fields") == [["+ added", "SlotMap", seen, f"{seen}, enabled"]]
    assert _rows(tabs, "Node", "Slots", "Schedulable", "Reasons") == [[seen, "0", "no → yes", seen]]
    assert _rows(tabs, "Node", "Slots", "Reasons") == [[seen, "1", f"{seen}, {seen}"]]
    assert _rows(tabs, "Node", "Capability", "Mode", "Why", "Running here") == [
        [seen, f"slice_capable → {seen}", f"- → {seen}", seen, f"1 running allocation(s) of {seen}"]
    ]
    assert _rows(tabs, "Allocation", "Tenant", "Node", "Slots", "Change") == [[seen, seen, seen, "0", seen]]
    assert _rows(tabs, "Allocation", "Tenant", "Request", "Node", "Slots", "VM profile") == [
        [seen, seen, f"1x {seen}", seen, "0", "<img src=//evil.invalid/p.png></details> (24 vCPU, 65536 MiB)"]
    ]
    assert _rows(tabs, "Allocation", "Code", "Reason", "New") == [[seen, seen, seen, "yes"]]
    assert _rows(tabs, "Allocation", "Tenant", "Node", "Slots") == [[seen, seen, seen, "1"]]
    inline = [plain(t)[0] for t in MD.parse(md) if t.type == "inline"]
    rev = rendering.one_line(prplan_summary.short(value))  # 40 characters read as a commit id: shortened
    assert inline[0] == f"gpuaas plan: {rev} → {rev}"
    assert any(text.endswith(f"to free them): {seen}, {seen}") for text in inline)


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_invalid_pr_plan_markdown_keeps_its_structure(value: str) -> None:
    seen = rendering.one_line(value)
    pr = PrPlan("main", value, False, errors=(p.Problem("desired.field.value", value, f"{value}.yaml", 3, 1),))
    benign = PrPlan("main", "x", False, errors=(p.Problem("desired.field.value", "x", "x.yaml", 3, 1),))
    tabs = check_document(prplan_render.render_markdown(pr), prplan_render.render_markdown(benign))
    assert tabs == [[["File", "Code", "Message"], [f"{seen}.yaml:3:1", "desired.field.value", seen]]]


def test_pr_plan_text_has_one_line_per_entry() -> None:
    v = "evil\n::error::forged\x1b[2J"
    text = prplan_render.render_text(hostile_plan(v))
    assert "\n::error::" not in text and "\x1b" not in text
    assert "evil ::error::forged\\x1b[2J" in text


# ------------------------------------------------------------------ drift


def hostile_nodes(v: str) -> list[dict[str, Any]]:
    finding = {"code": v, "slot_index": 0, "message": v, "expected": v, "observed": v, "heal": v}
    return [
        {"node": v, "drift": [finding]},
        {"node": "node-b", "drift": "garbage"},
        {"node": "node-c", "drift": [1, None, {"code": 5}]},
    ]


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_drift_markdown_keeps_its_structure_with_hostile_reports(value: str) -> None:
    seen = rendering.one_line(value)
    tabs = check_document(
        driftreports.drift_markdown(hostile_nodes(value)), driftreports.drift_markdown(hostile_nodes("x"))
    )
    assert len(tabs) == 1
    rows = {r[0]: r for r in tabs[0][1:]}
    assert rows[seen] == [seen, "0", seen, seen, seen, seen, seen]
    assert rows["node-b"][2] == rows["node-c"][2] == driftreports.INVALID


def test_drift_text_and_json_survive_malformed_reports() -> None:
    nodes = hostile_nodes("evil\n\x1b[2Jforged")
    text = driftreports.drift_text(nodes)
    assert "\x1b" not in text and len(text.splitlines()) == 4
    assert "node-b slot -: drift.report.invalid: the drift report of node-b is malformed: the report is str" in text
    assert "node-c slot -: drift.report.invalid" in text and "3 of 3 entries not shown" in text
    assert '"total": 3' in driftreports.drift_json(nodes)
