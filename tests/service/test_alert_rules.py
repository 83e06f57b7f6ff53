"""Shipped monitoring: the alert rules pass `promtool check rules` and their own `promtool test rules` cases
(one per alert), and every metric the rules and the Grafana dashboard query is one the product exports,
read from a real scrape of `serve` and of the host agent's registry (issue 34)."""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from host_reconciler import metrics as host_metrics
from tests.service.conftest import Served
from tests.service.test_metrics_usage import _samples

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "gpuaas-alerts.yml"
CASES = DEPLOY / "prometheus" / "gpuaas-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "gpuaas.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")
# Exported by integrity-loop's change to the fleet totals (HEAD applied or not), landing beside this one.
ELSEWHERE = {"gpuaas_head_applied"}
_NAME = re.compile(r"\b((?:gpuaas|process)_[a-zA-Z0-9_]*)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120, check=False)


@needs_promtool
def test_rules_are_valid_and_every_case_passes() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", CASES.name)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def _alerts() -> list[dict[str, str]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_case() -> None:
    cases = yaml.safe_load(CASES.read_text())["tests"]
    tested = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for c in cases for t in c["alert_rule_test"] if not t["exp_alerts"]}
    names = {a["alert"] for a in _alerts()}
    assert names == tested == quiet  # each fires in a case, and is silent before it does


def _exported(served: Served) -> set[str]:
    served.json("/api/v1/capacity")  # computed now: the next scrape exports the capacity families
    _, _, body = served.get("/metrics")
    agent = host_metrics.AgentMetrics("node-a")
    agent.failed()
    agent.converge.observe(1.0)
    # what a finished pass leaves (record() takes a whole PassResult): the newest pass's gauges
    agent._latest.last = (collections.Counter(), collections.Counter(), False, time.time())
    return set(_samples(body.decode())) | set(_samples(generate_latest(agent.registry).decode()))


def _queried(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def test_the_dashboard_and_the_rules_query_only_exported_metrics(served: Served) -> None:
    exported = _exported(served)
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    missing = {name for e in exprs for name in _queried(e)} - exported
    assert missing == set(), f"dashboard queries metrics nothing exports: {sorted(missing)}"
    rule_missing = {name for a in _alerts() for name in _queried(a["expr"])} - exported - ELSEWHERE
    assert rule_missing == set(), f"rules query metrics nothing exports: {sorted(rule_missing)}"
