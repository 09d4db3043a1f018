"""The Grafana dashboard, checked offline (no Grafana here): structure in the spirit of
grafana/dashboard-linter, PromQL that references only real metric names and parses with promtool,
and no drift between the collector's metric contract and its consumers (dashboard + alert rules)."""

from __future__ import annotations

import re

import pytest
import yaml
from prom_harness import run_promtool
from promql_refs import (
    DASHBOARD,
    PENDING_METRICS,
    alert_rules,
    concrete,
    dashboard_exprs,
    dashboard_panels,
    load_dashboard,
    metric_names,
    sglang_metric_names,
)

from advisor.export.collector import exported_metric_names

SGLANG_PANEL_METRICS = {
    "sglang:num_running_reqs",
    "sglang:num_retracted_requests_total",
}


@pytest.fixture(scope="module")
def dashboard():
    return load_dashboard()


def test_top_level_fields(dashboard):
    assert dashboard["uid"] == "sglang-pool-advisor"
    assert dashboard["id"] is None
    assert dashboard["title"] and "sglang" in dashboard["tags"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert DASHBOARD.read_text().endswith("\n")


def test_template_variables(dashboard):
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    datasource = variables["datasource"]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    assert datasource["label"] == "Data source"
    server, model_name = variables["server"], variables["model_name"]
    assert server["type"] == "query" and model_name["type"] == "query"
    assert server["query"]["query"] == "label_values(sglang_advisor_target_up, server)"
    assert model_name["query"]["query"].startswith("label_values(sglang_advisor_target_up")
    assert model_name["query"]["query"].endswith(", model_name)")
    for variable in (server, model_name):
        assert variable["datasource"]["uid"] == "${datasource}"
        assert variable["refresh"] == 2 and variable["includeAll"] and variable["multi"]


def test_panels_are_complete_and_laid_out(dashboard):
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    panels = dashboard_panels(dashboard)
    assert len(panels) >= 10
    for panel in panels:
        title = panel["title"]
        assert panel["description"].strip(), title
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, title
        assert panel["targets"], title
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        assert "unit" in panel["fieldConfig"]["defaults"], title
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", title
            # the panel's description names every metric it queries (as vLLM's dashboards do)
            for name in metric_names(target["expr"]):
                assert name in panel["description"], (title, name)


def test_required_panels_exist(dashboard):
    by_type: dict[str, set[str]] = {}
    for panel in dashboard_panels(dashboard):
        for name in {n for target in panel["targets"] for n in metric_names(target["expr"])}:
            by_type.setdefault(name, set()).add(panel["type"])
    assert "timeseries" in by_type["sglang_advisor_recommended_ratio"]
    assert "timeseries" in by_type["sglang_advisor_live_ratio"]
    assert by_type["sglang_advisor_decision"] & {"state-timeline", "stat"}
    assert by_type["sglang_advisor_binding_pool"] & by_type["sglang_advisor_recommended_binding_pool"]
    assert SGLANG_PANEL_METRICS <= set(by_type)
    exprs = "\n".join(dashboard_exprs(dashboard))
    assert 'rate(sglang:num_retracted_requests_total{' in exprs and 'tp_rank="0"' in exprs


def test_value_mappings_cover_every_decision_code(dashboard):
    from advisor.recommend.types import DECISIONS

    timeline = next(p for p in dashboard_panels(dashboard) if p["type"] == "state-timeline")
    options = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert sorted(options, key=int) == [str(code) for code in range(len(DECISIONS))]
    assert [options[str(code)]["text"].replace(" ", "_") for code in range(len(DECISIONS))] == list(DECISIONS)
    # the coded expression gives state i the weight i
    expr = timeline["targets"][0]["expr"]
    for code, decision in enumerate(DECISIONS[1:], start=1):
        # max per advisor instance: two advisors exporting one server must not add their codes
        assert f'{code} * max by (server, model_name, instance) (sglang_advisor_decision{{' in expr
        assert f'state="{decision}"' in expr


def test_rates_use_the_rate_interval(dashboard):
    for expr in dashboard_exprs(dashboard):
        for window in re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr


def test_exprs_reference_only_exported_or_sglang_metrics(dashboard):
    exported = set(exported_metric_names())
    sglang = sglang_metric_names()
    assert "sglang:num_running_reqs" in sglang  # the fixtures are there
    for expr in dashboard_exprs(dashboard):
        for name in metric_names(expr):
            if name.startswith("sglang:"):
                assert name in sglang, f"{name} is not a SGLang 0.5.23 metric ({expr})"
            elif name in PENDING_METRICS:
                assert name not in exported, f"{name} is exported now: remove it from PENDING_METRICS"
            else:
                assert name in exported, f"{name} is not exported by the collector ({expr})"
        assert "instance=~\"$server\"" in expr or "server=~\"$server\"" in expr, expr


def test_what_if_replay_row_shows_the_replay_metrics(dashboard):
    """The what-if replay's gain, curve width, the traffic regime's age and its trend sit in their own row, one panel each."""
    rows: dict[str, list[dict]] = {}
    current = None
    for panel in dashboard["panels"]:  # a row holds the panels after it, up to the next row
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        elif current is not None:
            current.append(panel)
    replay = rows["What-if replay"]
    queried = [{name for target in panel["targets"] for name in metric_names(target["expr"])} for panel in replay]
    assert queried == [{"sglang_advisor_predicted_goodput_gain_ratio"}, {"sglang_advisor_goodput_curve_width_ratio"},
                       {"sglang_advisor_traffic_regime_age_seconds"},
                       {"sglang_advisor_traffic_trend_load_ratio", "sglang_advisor_replay_queue_load_ratio",
                        "sglang_advisor_replay_work_scale_ratio"}]
    assert all(panel["type"] == "timeseries" for panel in replay)


def test_every_exported_metric_has_a_consumer(dashboard):
    consumed = {name for expr in dashboard_exprs(dashboard) for name in metric_names(expr)}
    consumed |= {name for rule in alert_rules() for name in metric_names(rule["expr"])}
    missing = set(exported_metric_names()) - consumed
    assert missing == set(), f"exported but neither on the dashboard nor in an alert: {sorted(missing)}"


def test_exprs_parse_with_promtool(dashboard, tmp_path):
    """Every panel expr and variable selector, variables filled in, as a recording rule promtool checks."""
    exprs = [concrete(expr) for expr in dashboard_exprs(dashboard)]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert selector, variable["query"]["query"]
            exprs.append(concrete(selector.group(1)))
    rules = {"groups": [{"name": "dashboard-exprs", "rules": [
        {"record": f"dashboard:expr_{index}:check", "expr": expr} for index, expr in enumerate(exprs)
    ]}]}
    path = tmp_path / "dashboard_exprs.yml"
    path.write_text(yaml.safe_dump(rules))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout
