"""The alert rules: promtool check/test on the shipped files, mixin-style structure, every alert tested
both firing and quiet, and a mutated rule making the unit tests fail."""

from __future__ import annotations

import re
import shutil

import yaml
from prom_harness import run_promtool
from promql_refs import ALERT_TESTS, ALERTS, EXAMPLE_CONFIG, alert_rules, metric_names

from advisor.export.collector import exported_metric_names

REQUIRED_ALERTS = {
    "SGLangPoolRatioDrift",
    "SGLangStatePoolSaturated",
    "SGLangRetractionStorm",
    "SGLangAdvisorTargetDown",
    "SGLangAdvisorInputsStale",
    "SGLangAdvisorScrapeErrors",
    "SGLangPoolAdvisorDown",
}
# Alerts about the advisor itself carry Prometheus' job/instance labels, not a server.
ADVISOR_ALERTS = {"SGLangPoolAdvisorDown"}
# Prometheus' own series an alert may use besides the exported ones.
PROMETHEUS_SERIES = {"up"}


def test_promtool_check_rules_is_clean():
    result = run_promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_rule_unit_tests_pass():
    result = run_promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_catch_a_broken_threshold(tmp_path):
    """Loosen the drift threshold in a copy: the firing/quiet cases must notice."""
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    rules = ALERTS.read_text()
    assert "abs(sglang_advisor_ratio_drift) > 0.4" in rules
    (tmp_path / ALERTS.name).write_text(rules.replace("abs(sglang_advisor_ratio_drift) > 0.4",
                                                      "abs(sglang_advisor_ratio_drift) > 0.05"))
    result = run_promtool("test", "rules", str(tmp_path / ALERT_TESTS.name))
    assert result.returncode != 0
    assert "SGLangPoolRatioDrift" in result.stdout + result.stderr


def test_example_prometheus_config_is_valid():
    result = run_promtool("check", "config", str(EXAMPLE_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_follow_the_mixin_style():
    document = yaml.safe_load(ALERTS.read_text())
    assert [group["name"] for group in document["groups"]] == ["sglang-pool-advisor"]
    rules = alert_rules()
    assert REQUIRED_ALERTS <= {rule["alert"] for rule in rules}
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"SGLang[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert re.fullmatch(r"[A-Z].*\.", rule["annotations"]["summary"]), name
        if name not in ADVISOR_ALERTS:
            assert "{{ $labels.server }}" in rule["annotations"]["description"], name
        assert rule["annotations"]["runbook"].strip(), name
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}", name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name


def test_capacity_alerts_say_which_flag_to_change():
    runbooks = {rule["alert"]: rule["annotations"]["runbook"] for rule in alert_rules()}
    for name in ("SGLangPoolRatioDrift", "SGLangStatePoolSaturated", "SGLangRetractionStorm"):
        assert "--mamba-full-memory-ratio" in runbooks[name], name
        assert "--max-mamba-cache-size" in runbooks[name], name


def test_rules_use_only_exported_metrics():
    exported = set(exported_metric_names())
    for rule in alert_rules():
        referenced = metric_names(rule["expr"])
        assert referenced, rule["alert"]
        assert referenced <= exported | PROMETHEUS_SERIES, (rule["alert"], referenced - exported)


def test_every_alert_has_a_firing_and_a_quiet_case():
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for group in tests["tests"]:
        for case in group.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"


def test_every_runbook_url_has_its_section():
    from promql_refs import REPO

    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
               for line in runbooks.splitlines() if line.startswith("## ")}
    for rule in alert_rules():
        assert rule["annotations"]["runbook_url"].split("#", 1)[1] in anchors, rule["alert"]


def test_state_pool_alert_is_gated_like_the_drift_alert():
    expr = next(rule["expr"] for rule in alert_rules() if rule["alert"] == "SGLangStatePoolSaturated")
    assert "sglang_advisor_confidence_ratio > 0.5" in expr
    assert 'sglang_advisor_decision{state=~"raise_ratio|pin_state_pool"} == 1' in expr
