"""Writes both Grafana dashboards from Grafana's own typed builders (grafana-foundation-sdk): the per-server
sglang-pool-advisor.json and the fleet sglang-pool-advisor-fleet.json, and the kustomize base's ConfigMap
holding both for Grafana's dashboard sidecar. `--check` writes nothing and exits 1 naming every committed
file that differs from what this writes (CI runs it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

try:
    from grafana_foundation_sdk.builders import bargauge, prometheus, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.builders import common as common_builder
    from grafana_foundation_sdk.builders import dashboard as dashboard_builder
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat
except ImportError as missing:  # a one-line answer instead of a traceback
    sys.exit(f"generate.py needs grafana-foundation-sdk (Python >= 3.11): pip install -e '.[dashboards]' ({missing})")

from advisor.recommend.types import DECISIONS

REPO = Path(__file__).resolve().parent.parent
# What this writes, relative to the repository.
SERVER_FILE = "dashboards/sglang-pool-advisor.json"
FLEET_FILE = "dashboards/sglang-pool-advisor-fleet.json"
CONFIGMAP_FILE = "deploy/kubernetes/grafana-dashboards.yaml"
# Grafana's dashboard sidecar (the grafana Helm chart's k8s-sidecar) loads every ConfigMap with this label;
# with its folderAnnotation set to grafana_folder, into this folder.
SIDECAR_LABEL = ("grafana_dashboard", "1")
GRAFANA_FOLDER = "SGLang"
SERVER_UID = "sglang-pool-advisor"
FLEET_UID = "sglang-pool-advisor-fleet"
SERVER_DASHBOARD_URL = f"/d/{SERVER_UID}/sglang-pool-advisor"
# The panels are written in Grafana 10.4's form (table cell options, legend showLegend), so the dashboards
# say so and Grafana runs no migration on them; the SDK's own default (36) predates that form.
SCHEMA_VERSION = 39
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every advisor series on the per-server dashboard is filtered by both variables; SGLang's own by instance.
ADVISOR_SELECTOR = 'server=~"$server", model_name=~"$model_name"'
SGLANG_SELECTOR = 'instance=~"$server", model_name=~"$model_name", tp_rank="0"'
# The fleet dashboard filters by model only; `max by (server)` collapses the copies of one server that
# two advisors exporting it produce.
FLEET_SELECTOR = 'model_name=~"$model_name"'
DECISION_COLOURS = {"insufficient_data": "text", "hold": "green", "raise_ratio": "orange", "lower_ratio": "orange",
                    "pin_state_pool": "purple", "unified_memory": "blue", "inputs_stale": "red"}
# The binding-pool state set drawn as a code: state pool 0, KV pool 1, balanced 2.
POOLS = (("state", "state pool", "purple"), ("kv", "KV pool", "blue"), ("balanced", "balanced", "green"))


# ---------------------------------------------------------------------------------------------- building blocks

def advisor(metric: str, extra: str = "") -> str:
    """A per-server advisor series under the dashboard's variables."""
    return f"{metric}{{{ADVISOR_SELECTOR}{', ' + extra if extra else ''}}}"


def query(expr: str, ref: str, legend: str = "", instant: bool = False, as_table: bool = False) -> Any:
    built = prometheus.Dataquery().expr(expr).ref_id(ref).legend_format(legend).datasource(DATASOURCE)
    built = built.instant() if instant else built.range()
    return built.format(PromQueryFormat.TABLE) if as_table else built


def fixed_colour(colour: str) -> dict[str, str]:
    return {"mode": "fixed", "fixedColor": colour}


def value_mapping(labels: dict[int, tuple[str, str | None]]) -> model.ValueMap:
    """Codes to (text, colour); the code is also the option's index."""
    return model.ValueMap(options={str(code): model.ValueMappingResult(text=text, color=colour, index=code)
                                   for code, (text, colour) in labels.items()})


def thresholds(*steps: tuple[float | None, str]) -> Any:
    return (dashboard_builder.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(value=value, color=colour) for value, colour in steps]))


def reduce_last() -> Any:
    return common_builder.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def series_panel(panel_id: int, title: str, description: str, unit: str, targets: list[Any],
                 width: int, height: int) -> Any:
    """A time series in the house style: thin lines, no points, gaps kept, the last value in a table legend."""
    return (timeseries.Panel().id(panel_id).title(title).description(description).datasource(DATASOURCE)
            .span(width).height(height).targets(targets).unit(unit)
            .draw_style(common.GraphDrawStyle.LINE).line_width(1).fill_opacity(0)
            .show_points(common.VisibilityMode.NEVER).span_nulls(False)
            .legend(common_builder.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                    .placement(common.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull"]))
            .tooltip(common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                     .sort(common.SortOrder.DESCENDING)))


def stat_panel(panel_id: int, title: str, description: str, unit: str, targets: list[Any],
               width: int, height: int, colour_mode: common.BigValueColorMode = common.BigValueColorMode.BACKGROUND,
               text_mode: common.BigValueTextMode = common.BigValueTextMode.VALUE_AND_NAME) -> Any:
    return (stat.Panel().id(panel_id).title(title).description(description).datasource(DATASOURCE)
            .span(width).height(height).targets(targets).unit(unit).reduce_options(reduce_last())
            .color_mode(colour_mode).graph_mode(common.BigValueGraphMode.NONE).text_mode(text_mode)
            .justify_mode(common.BigValueJustifyMode.AUTO).orientation(common.VizOrientation.AUTO))


def coded_state_set(metric: str, label: str, states: list[str]) -> str:
    """A state-set metric as one code per (server, advisor instance): state i weighs i. `max` per advisor
    instance, never a sum, so two advisors exporting one server never add their codes; state 0 weighs 0."""
    terms = [f"{code} * max by (server, model_name, instance) ({advisor(metric, f'{label}={chr(34)}{state}{chr(34)}')})"
             for code, state in enumerate(states) if code > 0]
    return "\n+ ".join(terms)


def dashboard_json(built: Any) -> str:
    document = json.loads(json.dumps(built, cls=JSONEncoder))
    document["id"] = None  # imported or provisioned anywhere: Grafana assigns the numeric id
    document["schemaVersion"] = SCHEMA_VERSION
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def common_dashboard(title: str, uid: str, description: str, tags: list[str]) -> Any:
    return (dashboard_builder.Dashboard(title).uid(uid).description(description).tags(tags)
            .timezone("browser").editable().tooltip(model.DashboardCursorSync.CROSSHAIR)
            .time("now-6h", "now").refresh("1m").fiscal_year_start_month(0).live_now(False).week_start("")
            .version(1)
            .annotation(dashboard_builder.AnnotationQuery().name("Annotations & Alerts").built_in(1)
                        .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                        .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)").type("dashboard"))
            .with_variable(dashboard_builder.DatasourceVariable("datasource").label("Data source").type("prometheus")
                           .regex("").hide(model.VariableHide.DONT_HIDE)))


def query_variable(name: str, label: str, selector: str, all_value: str) -> Any:
    definition = f"label_values({selector}, {name})"
    return (dashboard_builder.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query({"query": definition, "refId": f"{name}-variable"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(all_value)
            .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .sort(model.VariableSort.ALPHABETICAL_ASC).hide(model.VariableHide.DONT_HIDE).regex("").options([]))


# ---------------------------------------------------------------------------------------------- per server

def recommendation_panels() -> list[Any]:
    band = (series_panel(
        2, "Recommended vs live --mamba-full-memory-ratio ($server)",
        "The ratio the advisor recommends, the band it considers equivalent (shaded), and the ratio the server "
        "runs with. The ratio is state-pool bytes over full-attention KV bytes and may exceed 1. One panel per "
        "server. Metrics: sglang_advisor_recommended_ratio, sglang_advisor_recommended_ratio_lower, "
        "sglang_advisor_recommended_ratio_upper, sglang_advisor_live_ratio.",
        "none",
        [query(advisor("sglang_advisor_recommended_ratio"), "A", "recommended"),
         query(advisor("sglang_advisor_live_ratio"), "B", "live"),
         query(advisor("sglang_advisor_recommended_ratio_lower"), "C", "band lower"),
         query(advisor("sglang_advisor_recommended_ratio_upper"), "D", "band upper")],
        24, 9)
        .decimals(3).repeat("server").repeat_direction("h").max_per_row(2)
        .override_by_name("band upper", [
            model.DynamicConfigValue(id_val="custom.fillBelowTo", value="band lower"),
            model.DynamicConfigValue(id_val="custom.fillOpacity", value=20),
            model.DynamicConfigValue(id_val="custom.lineWidth", value=0),
            model.DynamicConfigValue(id_val="color", value=fixed_colour("green"))])
        .override_by_name("band lower", [
            model.DynamicConfigValue(id_val="custom.lineWidth", value=0),
            model.DynamicConfigValue(id_val="color", value=fixed_colour("green"))])
        .override_by_name("recommended", [
            model.DynamicConfigValue(id_val="custom.lineWidth", value=2),
            model.DynamicConfigValue(id_val="color", value=fixed_colour("green"))])
        .override_by_name("live", [
            model.DynamicConfigValue(id_val="custom.lineWidth", value=2),
            model.DynamicConfigValue(id_val="color", value=fixed_colour("orange"))]))
    decision = (
        statetimeline.Panel().id(3).title("Decision")
        .description("The advisor's decision per server over time: hold, raise ratio, lower ratio, pin state pool "
                     "(set --max-mamba-cache-size), unified memory, insufficient data or inputs stale. Metric: "
                     "sglang_advisor_decision (state set, 1 for the current decision). One row per advisor "
                     "instance (max, not sum, per state), so two advisors exporting the same server never add "
                     "their codes.")
        .datasource(DATASOURCE).span(12).height(5).unit("none")
        .with_target(query(coded_state_set("sglang_advisor_decision", "state", list(DECISIONS)), "A",
                           "{{server}} via {{instance}}"))
        .mappings([value_mapping({code: (state.replace("_", " "), DECISION_COLOURS[state])
                                  for code, state in enumerate(DECISIONS)})])
        .color_scheme(dashboard_builder.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .thresholds(thresholds((None, "text")))
        .show_value(common.VisibilityMode.AUTO).merge_values(True).row_height(0.9)
        .align_value(common.TimelineValueAlignment.LEFT).line_width(0).fill_opacity(70)
        .legend(common_builder.VizLegendOptions().show_legend(False).display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)))
    pools = [pool for pool, _, _ in POOLS]
    binding = (stat_panel(
        4, "Binding pool: now → at recommended ratio",
        "Which pool caps concurrency at the live ratio and which would at the recommended ratio: the state pool "
        "(recurrent-state slots), the KV pool (paged tokens) or balanced. Metrics: sglang_advisor_binding_pool, "
        "sglang_advisor_recommended_binding_pool (state sets over pool). One row per advisor instance (max, not "
        "sum, per state), so two advisors exporting the same server never add their codes.",
        "none",
        [query(coded_state_set("sglang_advisor_binding_pool", "pool", pools), "A", "{{server}} now via {{instance}}"),
         query(coded_state_set("sglang_advisor_recommended_binding_pool", "pool", pools), "B",
               "{{server}} at recommended via {{instance}}")],
        12, 5)
        .mappings([value_mapping({code: (text, colour) for code, (_, text, colour) in enumerate(POOLS)})])
        .color_scheme(dashboard_builder.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .thresholds(thresholds((None, "text"))))
    flags = (stat_panel(
        5, "Recommended flags",
        "The flag values the advisor recommends now: --mamba-full-memory-ratio, --max-mamba-cache-size (when it "
        "advises pinning the state pool) and --mem-fraction-static (when advised). Metrics: "
        "sglang_advisor_recommended_ratio, sglang_advisor_recommended_max_mamba_cache_size, "
        "sglang_advisor_recommended_mem_fraction_static.",
        "none",
        [query(advisor("sglang_advisor_recommended_ratio"), "A", "{{server}} --mamba-full-memory-ratio"),
         query(advisor("sglang_advisor_recommended_max_mamba_cache_size"), "B", "{{server}} --max-mamba-cache-size"),
         query(advisor("sglang_advisor_recommended_mem_fraction_static"), "C", "{{server}} --mem-fraction-static")],
        12, 4)
        .decimals(3).color_scheme(dashboard_builder.FieldColor().mode(model.FieldColorModeId.FIXED).fixed_color("blue")))
    confidence = (stat_panel(
        6, "Confidence and predicted gain",
        "How confident the advisor is (0-1; the drift alert needs > 0.5) and the predicted concurrency at the "
        "recommended ratio relative to the live one (1 = no gain). Metrics: sglang_advisor_confidence_ratio, "
        "sglang_advisor_predicted_gain_ratio.",
        "percentunit",
        [query(advisor("sglang_advisor_confidence_ratio"), "A", "{{server}} confidence"),
         query(advisor("sglang_advisor_predicted_gain_ratio"), "B", "{{server}} predicted gain")],
        12, 4)
        .min(0).thresholds(thresholds((None, "red"), (0.5, "orange"), (0.8, "green")))
        .override_by_query("B", [model.DynamicConfigValue(id_val="unit", value="none"),
                                 model.DynamicConfigValue(id_val="decimals", value=2),
                                 model.DynamicConfigValue(id_val="color", value=fixed_colour("blue"))]))
    return [band, decision, binding, flags, confidence]


def what_if_panels() -> list[Any]:
    gain = (series_panel(
        24, "Predicted goodput gain (what-if replay)",
        "Goodput the what-if replay predicts at the recommended ratio over goodput at the live ratio: the "
        "server's recent traffic replayed through the scheduler model (admission, reservation, retraction) at "
        "both splits (1 = nothing to gain, 1.1 = 10% more goodput). Empty until the advisor has replayed the "
        "server's traffic. Metric: sglang_advisor_predicted_goodput_gain_ratio.",
        "none", [query(advisor("sglang_advisor_predicted_goodput_gain_ratio"), "A", "{{server}}")], 12, 8)
        .decimals(3).thresholds(thresholds((None, "text"), (1.1, "orange"))))
    width = (series_panel(
        25, "Goodput curve width",
        "How flat the predicted goodput curve is around its best: the upper over the lower end of the ratio "
        "range whose predicted goodput is within 1% of the best (1 = one sharp optimum, 2 = any ratio within a "
        "factor of 2 does as well, so the exact ratio matters little). Metric: "
        "sglang_advisor_goodput_curve_width_ratio.",
        "none", [query(advisor("sglang_advisor_goodput_curve_width_ratio"), "A", "{{server}}")], 12, 8)
        .decimals(2).min(1))
    regime = (series_panel(
        26, "Traffic regime age",
        "Where the server's traffic changed character inside the what-if replay's window (a chat server turned "
        "document server, not a burst it has seen before): how long the new regime has lasted. While it shows, the "
        "new regime is replayed on its own as if it had filled the window, and the recommendation is read where "
        "both it and the whole window are on their plateaus. Empty with one regime. Metric: "
        "sglang_advisor_traffic_regime_age_seconds.",
        "s", [query(advisor("sglang_advisor_traffic_regime_age_seconds"), "A", "{{server}}")], 12, 6)
        .min(0))
    trend = (series_panel(
        27, "Traffic trend",
        "Where the same traffic came faster over the what-if replay window's last minutes than over the window (a "
        "morning's ramp, beyond the count's noise): their arrival rate over the window's, at most 1.5. While it "
        "shows, the window is replayed again that much heavier, and the recommendation is read where both it and "
        "the window as observed are on their plateaus: the traffic to come is heavier than the window's mean. "
        "Empty without a trend. Beside it, the load the window was replayed at because the server queued more than "
        "the replay did (its queue-time histogram showed more requests waiting beyond the queue bound at the live "
        "ratio): that heavier traffic decides with the window the same way. And the factor a metrics-only "
        "picture's output lengths were scaled by so that its replay at the live ratio admits requests at the rate "
        "the server did (a full state pool admits at its slots' turnover, which the outputs set). Metrics: "
        "sglang_advisor_traffic_trend_load_ratio, sglang_advisor_replay_queue_load_ratio, "
        "sglang_advisor_replay_work_scale_ratio.",
        "none", [query(advisor("sglang_advisor_traffic_trend_load_ratio"), "A", "{{server}} trend"),
                 query(advisor("sglang_advisor_replay_queue_load_ratio"), "B", "{{server}} as the server queued"),
                 query(advisor("sglang_advisor_replay_work_scale_ratio"), "C", "{{server}} output scale")],
        12, 6)
        .decimals(2).min(0.75))
    return [gain, width, regime, trend]


def pool_panels() -> list[Any]:
    clamp = (series_panel(
        8, "Max running requests: predicted clamp vs observed",
        "The concurrency clamp the advisor predicts at the live and at the recommended config, the highest "
        "running count it observed, and SGLang's own running and queued requests per DP rank (tp_rank 0). "
        "Metrics: sglang_advisor_predicted_max_running_requests, sglang_advisor_observed_max_running_requests, "
        "sglang:num_running_reqs, sglang:num_queue_reqs.",
        "short",
        [query(advisor("sglang_advisor_predicted_max_running_requests"), "A", "{{server}} predicted clamp ({{config}})"),
         query(advisor("sglang_advisor_observed_max_running_requests"), "B", "{{server}} observed max"),
         query(f"max by (instance, dp_rank) (sglang:num_running_reqs{{{SGLANG_SELECTOR}}})", "C",
               "{{instance}} running (dp {{dp_rank}})"),
         query(f"max by (instance, dp_rank) (sglang:num_queue_reqs{{{SGLANG_SELECTOR}}})", "D",
               "{{instance}} queued (dp {{dp_rank}})")],
        12, 8)
        .override_by_query("A", [model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
                                 model.DynamicConfigValue(id_val="custom.lineWidth", value=2)]))
    kv = series_panel(
        9, "KV pool capacity in requests",
        "How many requests of the effective context length the KV pool holds at the live and at the recommended "
        "config; when it is below the predicted clamp, the KV pool binds and SGLang retracts. Metric: "
        "sglang_advisor_kv_capacity_requests.",
        "short", [query(advisor("sglang_advisor_kv_capacity_requests"), "A", "{{server}} {{config}}")], 6, 8)
    usage = (series_panel(
        10, "Pool usage (SGLang)",
        "SGLang's own usage of the KV pool (token_usage) and of the recurrent-state pool (mamba_usage), per DP "
        "rank on tp_rank 0. Metrics: sglang:token_usage, sglang:mamba_usage.",
        "percentunit",
        [query(f"max by (instance, dp_rank) (sglang:token_usage{{{SGLANG_SELECTOR}}})", "A",
               "{{instance}} KV (dp {{dp_rank}})"),
         query(f"max by (instance, dp_rank) (sglang:mamba_usage{{{SGLANG_SELECTOR}}})", "B",
               "{{instance}} state (dp {{dp_rank}})")],
        6, 8)
        .min(0).max(1))
    return [clamp, kv, usage]


def workload_panels() -> list[Any]:
    context = (series_panel(
        12, "Context length",
        "Recency-weighted context length (prompt + output) of finished requests: p50, p90, p99 and mean, and "
        "the effective length the KV pool sees per running request (the L in r*). Metrics: "
        "sglang_advisor_context_length_tokens, sglang_advisor_context_length_mean_tokens, "
        "sglang_advisor_effective_context_length_tokens.",
        "short",
        [query(advisor("sglang_advisor_context_length_tokens"), "A", "{{server}} p{{quantile}}"),
         query(advisor("sglang_advisor_context_length_mean_tokens"), "B", "{{server}} mean"),
         query(advisor("sglang_advisor_effective_context_length_tokens"), "C", "{{server}} effective L")],
        12, 8)
        .axis_label("tokens"))
    spikiness = (series_panel(
        13, "Context-length spikiness",
        "How bursty or heavy-tailed the context-length distribution is (0 = steady); the advisor biases its "
        "ratio by it. Metric: sglang_advisor_context_length_spikiness.",
        "none", [query(advisor("sglang_advisor_context_length_spikiness"), "A", "{{server}}")], 6, 8)
        .min(0).decimals(2))
    facts = (series_panel(
        14, "Model facts (state slot size)",
        "token_equiv (one recurrent-state slot in KV-token equivalents) and the state slots one request holds "
        "(S + D); together with L they set r*. Metrics: sglang_advisor_token_equiv, "
        "sglang_advisor_slots_per_request.",
        "short",
        [query(advisor("sglang_advisor_token_equiv"), "A", "{{server}} token_equiv"),
         query(advisor("sglang_advisor_slots_per_request"), "B", "{{server}} slots per request")],
        6, 8)
        .override_by_query("B", [model.DynamicConfigValue(id_val="custom.axisPlacement", value="right")]))
    retractions = (series_panel(
        15, "Retractions per second",
        "Requests SGLang retracts because the KV pool is full: the advisor's recency-weighted rate and SGLang's "
        "counter rate (tp_rank 0 only: every TP rank counts the same retractions). Metrics: "
        "sglang_advisor_retractions_per_second, sglang:num_retracted_requests_total.",
        "reqps",
        [query(advisor("sglang_advisor_retractions_per_second"), "A", "{{server}} advisor"),
         query(f"sum by (instance) (rate(sglang:num_retracted_requests_total{{{SGLANG_SELECTOR}}}[$__rate_interval]))",
               "B", "{{instance}} SGLang counter")],
        12, 8)
        .min(0))
    saturation = (series_panel(
        16, "State pool saturation / KV blocked",
        "Fraction of time requests sat at the state-pool clamp with a queue waiting (the state pool binds; the "
        "saturation alert fires above 50%), and fraction of time a queue waited below the clamp (the KV pool "
        "binds). Metrics: sglang_advisor_state_pool_saturation_ratio, sglang_advisor_kv_blocked_ratio.",
        "percentunit",
        [query(advisor("sglang_advisor_state_pool_saturation_ratio"), "A", "{{server}} state pool saturated"),
         query(advisor("sglang_advisor_kv_blocked_ratio"), "B", "{{server}} KV blocked")],
        12, 8)
        .min(0).max(1))
    return [context, spikiness, facts, retractions, saturation]


def health_panels() -> list[Any]:
    up = (stat_panel(
        18, "Target up", "Whether the advisor's last cycle could read each SGLang server. Metric: "
        "sglang_advisor_target_up.",
        "none", [query(advisor("sglang_advisor_target_up"), "A", "{{server}}")], 6, 6)
        .mappings([value_mapping({0: ("DOWN", "red"), 1: ("UP", "green")})])
        .color_scheme(dashboard_builder.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .thresholds(thresholds((None, "red"), (1, "green"))))
    since = (stat_panel(
        19, "Time since last successful cycle",
        "Seconds since the advisor last completed a cycle for the server (the stale alert fires after 15 min "
        "while the server is up). Metric: sglang_advisor_last_success_timestamp_seconds.",
        "s", [query(f"time() - {advisor('sglang_advisor_last_success_timestamp_seconds')}", "A", "{{server}}")], 6, 6)
        .thresholds(thresholds((None, "green"), (900, "red"))))
    errors = (series_panel(
        20, "Input read errors",
        "Rate of failed reads of each server's inputs (metrics, server info, logs) by the advisor. Metric: "
        "sglang_advisor_scrape_errors_total. Also SGLang restarts the advisor detected (counters reset, or the "
        "URL answering for another server): sglang_advisor_server_restarts_total.",
        "short",
        [query(f"sum by (server, source) (rate({advisor('sglang_advisor_scrape_errors_total')}[$__rate_interval]))",
               "A", "{{server}} {{source}}"),
         query(f"sum by (server) (increase({advisor('sglang_advisor_server_restarts_total')}[$__rate_interval]))",
               "B", "{{server}} SGLang restarts")],
        6, 6)
        .min(0))
    duration = (series_panel(
        21, "Cycle duration",
        "Wall-clock duration of the advisor's last cycle per server. Metric: sglang_advisor_cycle_duration_seconds.",
        "s", [query(advisor("sglang_advisor_cycle_duration_seconds"), "A", "{{server}}")], 6, 6)
        .min(0))
    facts = (table.Panel().id(22).title("Serving facts")
             .description("What the recommendation assumed about each server: SGLang version, speculative/overlap "
                          "strategy, state and KV dtypes, tp/dp/pp/dcp sizes. Metric: sglang_advisor_info.")
             .datasource(DATASOURCE).span(24).height(5).unit("none").show_header(True)
             .align(common.FieldTextAlignment.AUTO).inspect(False)
             .with_target(query(advisor("sglang_advisor_info"), "A", instant=True, as_table=True))
             .with_transformation(model.DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True},
                 "indexByName": {"server": 0, "model_name": 1, "version": 2, "strategy": 3, "ssm_dtype": 4,
                                 "kv_dtype": 5, "tp": 6, "dp": 7, "pp": 8, "dcp": 9}})))
    return [up, since, errors, duration, facts]


def server_dashboard() -> str:
    built = (common_dashboard(
        "SGLang / Pool advisor", SERVER_UID,
        "The SGLang pool advisor's recommendation for --mamba-full-memory-ratio against the live config, with "
        "the workload and pool signals behind it.", ["sglang", "sglang-pool-advisor", "mamba"])
        .link(dashboard_builder.DashboardLink("SGLang dashboards").type(model.DashboardLinkType.DASHBOARDS)
              .tags(["sglang"]).as_dropdown(True).include_vars(False).keep_time(True))
        .with_variable(query_variable("server", "Server", "sglang_advisor_target_up", ".+"))
        .with_variable(query_variable("model_name", "Model", 'sglang_advisor_target_up{server=~"$server"}', ".*")))
    rows = [(1, "Recommendation", recommendation_panels()),
            (23, "What-if replay", what_if_panels()),
            (7, "Concurrency and pools", pool_panels()),
            (11, "Workload", workload_panels()),
            (17, "Advisor health", health_panels())]
    for row_id, title, panels in rows:
        built = built.with_row(dashboard_builder.Row(title).id(row_id).collapsed(False))
        for panel in panels:
            built = built.with_panel(panel)
    return dashboard_json(built.build())


# ---------------------------------------------------------------------------------------------- fleet

def per_server(metric: str, extra: str = "") -> str:
    matchers = ", ".join(filter(None, [FLEET_SELECTOR, extra]))
    return f"max by (server) ({metric}{{{matchers}}})"


def fleet_decision_code() -> str:
    """The decision as its code (the index in DECISIONS), one value per server, never a sum."""
    return "\nor ".join(f"({per_server('sglang_advisor_decision', f'state={chr(34)}{state}{chr(34)}')} == 1) * {code}"
                        for code, state in enumerate(DECISIONS))


def fleet_dashboard() -> str:
    renames = {"Value #A": "|drift| (ln)", "Value #B": "predicted gain", "Value #C": "live r",
               "Value #D": "recommended r", "Value #E": "confidence", "Value #F": "decision", "Value #G": "up"}
    server_link = {"title": "Open this server's dashboard",
                   "url": f"{SERVER_DASHBOARD_URL}?var-server=${{__data.fields.server}}&${{__url_time_range}}"
                          "&${datasource:queryparam}"}
    decision_mapping = value_mapping({code: (state.replace("_", " "), None) for code, state in enumerate(DECISIONS)})
    servers = (
        table.Panel().id(1).title("Servers by drift and predicted gain")
        .description("Every server the advisors watch, one row each, sorted by |sglang_advisor_ratio_drift| (how "
                     "far the live --mamba-full-memory-ratio is from the recommendation, as |ln live/recommended|) "
                     "and then by sglang_advisor_predicted_gain_ratio. Also sglang_advisor_live_ratio, "
                     "sglang_advisor_recommended_ratio, sglang_advisor_confidence_ratio, sglang_advisor_decision "
                     "and sglang_advisor_target_up. max by (server) keeps one row when two advisors export the "
                     "same server. Click a server for its dashboard.")
        .datasource(DATASOURCE).span(24).height(12).unit("none").align(common.FieldTextAlignment.AUTO).inspect(False)
        .targets([query(f"abs({per_server('sglang_advisor_ratio_drift')})", "A", instant=True, as_table=True),
                  query(per_server("sglang_advisor_predicted_gain_ratio"), "B", instant=True, as_table=True),
                  query(per_server("sglang_advisor_live_ratio"), "C", instant=True, as_table=True),
                  query(per_server("sglang_advisor_recommended_ratio"), "D", instant=True, as_table=True),
                  query(per_server("sglang_advisor_confidence_ratio"), "E", instant=True, as_table=True),
                  query(fleet_decision_code(), "F", instant=True, as_table=True),
                  query(per_server("sglang_advisor_target_up"), "G", instant=True, as_table=True)])
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(model.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True}, "renameByName": renames,
            "indexByName": {"server": 0, "Value #A": 1, "Value #B": 2}}))
        .with_transformation(model.DataTransformerConfig(id_val="sortBy", options={"sort": [
            {"field": "|drift| (ln)", "desc": True}, {"field": "predicted gain", "desc": True}]}))
        .override_by_name("server", [model.DynamicConfigValue(id_val="links", value=[server_link])])
        .override_by_name("decision", [model.DynamicConfigValue(id_val="mappings", value=[decision_mapping])])
        .override_by_name("predicted gain", [
            model.DynamicConfigValue(id_val="unit", value="percentunit"),
            model.DynamicConfigValue(id_val="decimals", value=2),
            model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}),
            model.DynamicConfigValue(id_val="thresholds", value=thresholds((None, "transparent"), (1.1, "orange")).build())])
        .show_header(True).cell_height(common.TableCellHeight.SM)
        .footer(common_builder.TableFooterOptions().show(False).reducer([])))
    per_decision = stat_panel(
        2, "Servers per decision",
        "How many servers each decision covers: count of sglang_advisor_decision == 1 by state (deduplicated "
        "per server).",
        "none",
        [query(f"count by (state) (max by (server, state) (sglang_advisor_decision{{{FLEET_SELECTOR}}}) == 1)", "A",
               "{{state}}")],
        12, 6, colour_mode=common.BigValueColorMode.VALUE)
    top_gains = (
        bargauge.Panel().id(3).title("Top 10 predicted gains")
        .description("The ten servers with the largest sglang_advisor_predicted_gain_ratio: concurrency at the "
                     "recommended ratio over concurrency at the live one (1 = nothing to gain).")
        .datasource(DATASOURCE).span(12).height(6).unit("none").min(1).decimals(2)
        .with_target(query(f"topk(10, {per_server('sglang_advisor_predicted_gain_ratio')})", "A", "{{server}}",
                           instant=True))
        .reduce_options(reduce_last()).orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT))
    drifts = (series_panel(
        4, "Largest drifts over time",
        "The ten servers furthest from their recommendation over time: |sglang_advisor_ratio_drift| "
        "(|ln live/recommended|; 0.4 is the drift alert's threshold).",
        "none", [query(f"topk(10, abs({per_server('sglang_advisor_ratio_drift')}))", "A", "{{server}}")], 24, 8)
        .min(0))
    steps = (series_panel(
        5, "Advisor cycle steps (p90)",
        "Where the advisors' cycles spend their time: the 90th percentile of "
        "sglang_advisor_cycle_step_duration_seconds per step (logs, metrics, server_info, recommend per target; "
        "target; checkpoint; cycle) over all advisors. A cycle near the interval means targets time out.",
        "s",
        [query("histogram_quantile(0.9, sum by (le, step) "
               "(rate(sglang_advisor_cycle_step_duration_seconds_bucket[$__rate_interval])))", "A", "{{step}}")],
        12, 8)
        .min(0))
    advisors = (
        table.Panel().id(6).title("Advisors")
        .description("Each advisor process: its version and Python from sglang_advisor_build_info, and its resident "
                     "memory (process_resident_memory_bytes of the same instance).")
        .datasource(DATASOURCE).span(12).height(8).unit("bytes").align(common.FieldTextAlignment.AUTO).inspect(False)
        .targets([query("sglang_advisor_build_info", "A", instant=True, as_table=True),
                  query("process_resident_memory_bytes and on (instance, job) sglang_advisor_build_info", "B",
                        instant=True, as_table=True)])
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(model.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "__name__": True, "Value #A": True},
            "renameByName": {"Value #B": "resident memory"}})))
    built = (common_dashboard(
        "SGLang / Pool advisor fleet", FLEET_UID,
        f"Every SGLang server the pool advisors watch, sorted by drift and predicted gain; each links into the "
        f"per-server dashboard (uid {SERVER_UID}).", ["sglang", "pool-advisor"])
        .link(dashboard_builder.DashboardLink("Per-server dashboard").type(model.DashboardLinkType.LINK)
              .url(SERVER_DASHBOARD_URL).keep_time(True).include_vars(False).target_blank(False).as_dropdown(False)
              .tags([]).icon("dashboard"))
        .with_variable(query_variable("model_name", "Model", "sglang_advisor_target_up", ".*")))
    for panel in (servers, per_decision, top_gains, drifts, steps, advisors):
        built = built.with_panel(panel)
    return dashboard_json(built.build())


# ---------------------------------------------------------------------------------------------- kubernetes

def sidecar_configmap(dashboards: dict[str, str]) -> str:
    """Both dashboards in one ConfigMap (a plain resource of the kustomize base: kustomize may only read
    files below its own directory, and a fixed name keeps the sidecar from seeing an old copy beside a new)."""
    label, value = SIDECAR_LABEL
    lines = ["# Written by dashboards/generate.py with both dashboards in it: edit generate.py, not this file.",
             "# Grafana's dashboard sidecar loads it by its label (see deploy/README.md).",
             "apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: pool-advisor-dashboards",
             "  labels:", f'    {label}: "{value}"', "  annotations:", f"    grafana_folder: {GRAFANA_FOLDER}",
             "data:"]
    for path, text in dashboards.items():
        lines.append(f"  {Path(path).name}: |")
        lines.extend(f"    {line}" for line in text.splitlines())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- command line

def rendered() -> dict[str, str]:
    dashboards = {SERVER_FILE: server_dashboard(), FLEET_FILE: fleet_dashboard()}
    return {**dashboards, CONFIGMAP_FILE: sidecar_configmap(dashboards)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed dashboard is not what this writes")
    parser.add_argument("--root", type=Path, default=REPO,
                        help="the repository to write into or check (default: the one holding this file)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"--root {args.root} is not a directory")
    stale = []
    for name, text in rendered().items():
        path = args.root / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale: {', '.join(stale)}; run python3 dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
