"""Generates dashboards/sglang-pool-advisor-fleet.json: every server the advisors watch, sorted by drift
and predicted gain, each row linking into the per-server dashboard. Plain Python, no grafanalib;
`python3 dashboards/generate_fleet.py --check` fails when the committed JSON is not what this writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "sglang-pool-advisor-fleet.json"
UID = "sglang-pool-advisor-fleet"
SERVER_DASHBOARD = "/d/sglang-pool-advisor/sglang-pool-advisor"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Every advisor series is filtered by this one selector (the model_name variable); `max by (server)`
# collapses the copies two advisors exporting one server produce.
SELECTOR = 'model_name=~"$model_name"'
DECISION_CODES = ("insufficient_data", "hold", "raise_ratio", "lower_ratio", "pin_state_pool", "unified_memory",
                  "inputs_stale")


def per_server(metric: str, extra: str = "") -> str:
    matchers = ", ".join(filter(None, [SELECTOR, extra]))
    return f"max by (server) ({metric}{{{matchers}}})"


def target(expr: str, ref: str, legend: str = "", instant: bool = False, fmt: str = "time_series") -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "refId": ref, "legendFormat": legend,
            "instant": instant, "range": not instant, "format": fmt}


def panel(panel_id: int, kind: str, title: str, description: str, grid: tuple[int, int, int, int],
          targets: list[dict[str, Any]], unit: str, **extra: Any) -> dict[str, Any]:
    x, y, w, h = grid
    body = {"id": panel_id, "type": kind, "title": title, "description": description, "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}}
    for key, value in extra.items():
        if key == "defaults":
            body["fieldConfig"]["defaults"].update(value)
        elif key == "overrides":
            body["fieldConfig"]["overrides"] = value
        else:
            body[key] = value
    return body


def decision_code_expr() -> str:
    """The decision as its code (the index in DECISION_CODES), one value per server, never a sum."""
    terms = []
    for code, state in enumerate(DECISION_CODES):
        selector = per_server("sglang_advisor_decision", f'state="{state}"')
        terms.append(f"({selector} == 1) * {code}")
    return "\nor ".join(terms)


def build() -> dict[str, Any]:
    table_targets = [
        target(f"abs({per_server('sglang_advisor_ratio_drift')})", "A", instant=True, fmt="table"),
        target(per_server("sglang_advisor_predicted_gain_ratio"), "B", instant=True, fmt="table"),
        target(per_server("sglang_advisor_live_ratio"), "C", instant=True, fmt="table"),
        target(per_server("sglang_advisor_recommended_ratio"), "D", instant=True, fmt="table"),
        target(per_server("sglang_advisor_confidence_ratio"), "E", instant=True, fmt="table"),
        target(decision_code_expr(), "F", instant=True, fmt="table"),
        target(per_server("sglang_advisor_target_up"), "G", instant=True, fmt="table"),
    ]
    renames = {"Value #A": "|drift| (ln)", "Value #B": "predicted gain", "Value #C": "live r",
               "Value #D": "recommended r", "Value #E": "confidence", "Value #F": "decision", "Value #G": "up"}
    link = {"title": "Open this server's dashboard",
            "url": f"{SERVER_DASHBOARD}?var-server=${{__data.fields.server}}&${{__url_time_range}}&${{datasource:queryparam}}"}
    decision_mapping = {"type": "value", "options": {str(code): {"text": state.replace("_", " "), "index": code}
                                                       for code, state in enumerate(DECISION_CODES)}}
    panels = [
        panel(1, "table", "Servers by drift and predicted gain",
              "Every server the advisors watch, one row each, sorted by |sglang_advisor_ratio_drift| (how far the "
              "live --mamba-full-memory-ratio is from the recommendation, as |ln live/recommended|) and then by "
              "sglang_advisor_predicted_gain_ratio. Also sglang_advisor_live_ratio, sglang_advisor_recommended_ratio, "
              "sglang_advisor_confidence_ratio, sglang_advisor_decision and sglang_advisor_target_up. max by (server) "
              "keeps one row when two advisors export the same server. Click a server for its dashboard.",
              (0, 0, 24, 12), table_targets, "none",
              transformations=[
                  {"id": "merge", "options": {}},
                  {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": renames,
                                                 "indexByName": {"server": 0, "Value #A": 1, "Value #B": 2}}},
                  {"id": "sortBy", "options": {"sort": [{"field": "|drift| (ln)", "desc": True},
                                                        {"field": "predicted gain", "desc": True}]}},
              ],
              overrides=[
                  {"matcher": {"id": "byName", "options": "server"},
                   "properties": [{"id": "links", "value": [link]}]},
                  {"matcher": {"id": "byName", "options": "decision"},
                   "properties": [{"id": "mappings", "value": [decision_mapping]}]},
                  {"matcher": {"id": "byName", "options": "predicted gain"},
                   "properties": [{"id": "unit", "value": "percentunit"}, {"id": "decimals", "value": 2},
                                  {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                                  {"id": "thresholds", "value": {"mode": "absolute", "steps": [
                                      {"color": "transparent", "value": None}, {"color": "orange", "value": 1.1}]}}]},
              ],
              options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}),
        panel(2, "stat", "Servers per decision",
              "How many servers each decision covers: count of sglang_advisor_decision == 1 by state (deduplicated "
              "per server).",
              (0, 12, 12, 6),
              [target(f"count by (state) (max by (server, state) (sglang_advisor_decision{{{SELECTOR}}}) == 1)", "A",
                      legend="{{state}}")],
              "none", options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                               "textMode": "value_and_name", "colorMode": "value", "graphMode": "none"}),
        panel(3, "bargauge", "Top 10 predicted gains",
              "The ten servers with the largest sglang_advisor_predicted_gain_ratio: concurrency at the recommended "
              "ratio over concurrency at the live one (1 = nothing to gain).",
              (12, 12, 12, 6),
              [target(f"topk(10, {per_server('sglang_advisor_predicted_gain_ratio')})", "A", legend="{{server}}",
                      instant=True)],
              "none", defaults={"min": 1, "decimals": 2},
              options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "orientation": "horizontal", "displayMode": "gradient"}),
        panel(4, "timeseries", "Largest drifts over time",
              "The ten servers furthest from their recommendation over time: |sglang_advisor_ratio_drift| "
              "(|ln live/recommended|; 0.4 is the drift alert's threshold).",
              (0, 18, 24, 8),
              [target(f"topk(10, abs({per_server('sglang_advisor_ratio_drift')}))", "A", legend="{{server}}")],
              "none", defaults={"min": 0}),
        panel(5, "timeseries", "Advisor cycle steps (p90)",
              "Where the advisors' cycles spend their time: the 90th percentile of "
              "sglang_advisor_cycle_step_duration_seconds per step (logs, metrics, server_info, recommend per "
              "target; target; checkpoint; cycle) over all advisors. A cycle near the interval means targets time out.",
              (0, 26, 12, 8),
              [target("histogram_quantile(0.9, sum by (le, step) "
                      "(rate(sglang_advisor_cycle_step_duration_seconds_bucket[$__rate_interval])))", "A",
                      legend="{{step}}")],
              "s", defaults={"min": 0}),
        panel(6, "table", "Advisors",
              "Each advisor process: its version and Python from sglang_advisor_build_info, and its resident "
              "memory (process_resident_memory_bytes of the same instance).",
              (12, 26, 12, 8),
              [target("sglang_advisor_build_info", "A", instant=True, fmt="table"),
               target("process_resident_memory_bytes and on (instance, job) sglang_advisor_build_info", "B",
                      instant=True, fmt="table")],
              "bytes",
              transformations=[{"id": "merge", "options": {}},
                               {"id": "organize", "options": {
                                   "excludeByName": {"Time": True, "__name__": True, "Value #A": True},
                                   "renameByName": {"Value #B": "resident memory"}}}]),
    ]
    variables = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "refresh": 1,
         "hide": 0, "current": {}, "options": [], "regex": ""},
        {"name": "model_name", "label": "Model", "type": "query", "datasource": DATASOURCE,
         "query": {"query": "label_values(sglang_advisor_target_up, model_name)", "refId": "model-variable"},
         "definition": "label_values(sglang_advisor_target_up, model_name)", "refresh": 2, "multi": True,
         "includeAll": True, "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
         "sort": 1, "hide": 0, "regex": "", "options": []},
    ]
    return {
        "id": None, "uid": UID, "title": "SGLang / Pool advisor fleet",
        "description": "Every SGLang server the pool advisors watch, sorted by drift and predicted gain; "
                       "each links into the per-server dashboard (uid sglang-pool-advisor).",
        "tags": ["sglang", "pool-advisor"], "timezone": "browser", "editable": True, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "time": {"from": "now-6h", "to": "now"}, "refresh": "1m",
        "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "annotations": {"list": []},
        "links": [{"title": "Per-server dashboard", "type": "link", "url": SERVER_DASHBOARD, "keepTime": True,
                   "includeVars": False, "targetBlank": False, "asDropdown": False, "tags": [], "icon": "dashboard"}],
        "templating": {"list": variables},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != render():
            sys.exit(f"{OUT.name} is stale: run python3 dashboards/generate_fleet.py")
    else:
        OUT.write_text(render())
