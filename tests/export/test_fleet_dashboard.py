"""The fleet dashboard: its panels follow the per-server dashboard's rules, its rows link into the
per-server dashboard, and against a real Prometheus scraping two advisors that export the same server it
shows one row per server with the right decision (codes never added)."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from export_samples import drifted_status
from prom_harness import PrometheusServer, run_promtool, wait_for
from promql_refs import FLEET_DASHBOARD, concrete, dashboard_panels, load_dashboard, metric_names

from advisor.export.collector import exported_metric_names
from advisor.export.server import ExporterServer
from advisor.export.snapshot import SnapshotStore
from advisor.recommend.types import DECISIONS

# The advisor process's own series (not per SGLang server) the fleet dashboard may show.
DAEMON_METRICS = {"sglang_advisor_build_info", "sglang_advisor_cycle_step_duration_seconds_bucket",
                  "process_resident_memory_bytes"}
FLEET = FLEET_DASHBOARD


@pytest.fixture(scope="module")
def fleet() -> dict:
    return json.loads(FLEET.read_text())


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard_panels(dashboard) for t in p["targets"]]


def _concrete(expr: str) -> str:
    return concrete(expr)


def test_panels_are_complete_and_name_their_metrics(fleet):
    assert fleet["uid"] == "sglang-pool-advisor-fleet" and fleet["id"] is None and "sglang" in fleet["tags"]
    exported = set(exported_metric_names())
    for panel in dashboard_panels(fleet):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert "unit" in panel["fieldConfig"]["defaults"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            for name in names:
                assert name in exported | DAEMON_METRICS, name
                assert name.removesuffix("_bucket") in panel["description"], (panel["title"], name)
            if names <= exported:  # per-server series follow the model filter; the advisors' own do not
                assert 'model_name=~"$model_name"' in target["expr"]
            for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", target["expr"]):
                assert window == "$__rate_interval"


def test_table_sorts_by_drift_then_gain_and_links_each_server(fleet):
    table = next(p for p in dashboard_panels(fleet) if p["type"] == "table")
    sort = next(t for t in table["transformations"] if t["id"] == "sortBy")["options"]["sort"]
    assert [(s["field"], s["desc"]) for s in sort] == [("|drift| (ln)", True), ("predicted gain", True)]
    server_links = next(o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "server")
    url = server_links["properties"][0]["value"][0]["url"]
    assert url.startswith(f"/d/{load_dashboard()['uid']}/") and "var-server=${__data.fields.server}" in url
    mapping = next(o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "decision")
    options = mapping["properties"][0]["value"][0]["options"]
    assert [options[str(code)]["text"].replace(" ", "_") for code in range(len(DECISIONS))] == list(DECISIONS)


def test_exprs_parse_with_promtool(fleet, tmp_path):
    exprs = [_concrete(expr) for expr in _exprs(fleet)]
    rules = {"groups": [{"name": "fleet", "rules": [{"record": f"fleet:expr_{i}:check", "expr": e}
                                                    for i, e in enumerate(exprs)]}]}
    path = tmp_path / "fleet.yml"
    path.write_text(yaml.safe_dump(rules))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_advisors_exporting_one_server(prometheus_server, fleet):
    """Advisors A and B both watch 10.0.0.7 (raise_ratio); only A watches 10.0.0.9 (hold)."""
    now = time.time()
    shared, only_a = drifted_status(server="10.0.0.7:30000"), drifted_status(server="10.0.0.9:30000", decision="hold")
    store_a, store_b = SnapshotStore(), SnapshotStore()
    store_a.publish([shared, only_a], now=now)
    store_b.publish([shared], now=now)
    with ExporterServer(store_a, "127.0.0.1", 0) as a, ExporterServer(store_b, "127.0.0.1", 0) as b:
        prometheus: PrometheusServer = prometheus_server(
            scrape_targets={"sglang-pool-advisor": [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]})
        wait_for(lambda: len(prometheus.query("sglang_advisor_target_up")) == 3, timeout=15,
                 what="both advisors scraped")
        table = next(p for p in dashboard_panels(fleet) if p["type"] == "table")
        by_ref = {t["refId"]: _concrete(t["expr"]) for t in table["targets"]}
        decisions = {s["metric"]["server"]: float(s["value"][1]) for s in prometheus.query(by_ref["F"])}
        assert decisions == {"10.0.0.7:30000": DECISIONS.index("raise_ratio"), "10.0.0.9:30000": DECISIONS.index("hold")}
        for ref in "ABCDEG":  # one row per server, whatever the number of advisors
            assert sorted(s["metric"]["server"] for s in prometheus.query(by_ref[ref])) == [
                "10.0.0.7:30000", "10.0.0.9:30000"], ref
        for panel in dashboard_panels(fleet):  # every fleet panel has data (rates need a second scrape)
            for expr in (_concrete(target["expr"]) for target in panel["targets"]):
                wait_for(lambda expr=expr: prometheus.query(expr), timeout=10, what=f"data for {panel['title']}")
        # the per-server dashboard's decision timeline: one series per advisor, each with the right code
        timeline = next(p for p in dashboard_panels(load_dashboard()) if p["type"] == "state-timeline")
        series = prometheus.query(concrete(timeline["targets"][0]["expr"]).replace('server=~".+"',
                                                                                    'server="10.0.0.7:30000"'))
        assert len(series) == 2 and {float(s["value"][1]) for s in series} == {DECISIONS.index("raise_ratio")}
        assert all(re.fullmatch(r"127\.0\.0\.1:\d+", s["metric"]["instance"]) for s in series)
