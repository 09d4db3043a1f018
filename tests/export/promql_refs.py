"""Helpers for checking PromQL held in the dashboard and the alert rules: which metric names an
expression references, and a concrete version of a Grafana expression with its variables filled in."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "sglang-pool-advisor.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
EXAMPLE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
SGLANG_FIXTURES = REPO / "tests" / "fixtures" / "metrics"
FLEET_DASHBOARD = REPO / "dashboards" / "sglang-pool-advisor-fleet.json"
DASHBOARD_GENERATOR = REPO / "dashboards" / "generate.py"

# Expected-pending: metrics a dashboard panel queries before the advisor exports them (the what-if replay's).
# Their queries must still parse and run against a real Prometheus; they need not return data, nor be
# exported yet. Remove a name here once the collector exports it (test_dashboard fails until you do).
PENDING_METRICS: set[str] = set()

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "Inf", "NaN"}
# Grafana's built-in interval variables -> a concrete duration; dashboard variables -> a match-all regex.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
DASHBOARD_VARIABLE_VALUES = {"$server": ".+", "$model_name": ".*"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (functions, keywords, labels and durations left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function call
        if match.group() not in _KEYWORDS:
            names.add(match.group())
    return names


def concrete(expr: str) -> str:
    """The expression as Prometheus would receive it from Grafana with every variable at "All"."""
    for variable, value in {**GRAFANA_VARIABLES, **DASHBOARD_VARIABLE_VALUES}.items():
        expr = expr.replace(variable, value)
    leftover = re.findall(r"\$\w+", expr)
    if leftover:
        raise ValueError(f"undefined dashboard variables {leftover} in {expr!r}")
    return expr


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows, rows themselves excluded."""
    panels = []
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            panels.extend(panel.get("panels", []))
        else:
            panels.append(panel)
    return panels


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard_panels(dashboard) for target in panel.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def sglang_metric_names() -> set[str]:
    """Every series name in the genuine SGLang 0.5.23 /metrics fixtures."""
    names = set()
    for path in SGLANG_FIXTURES.glob("*.prom"):
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
