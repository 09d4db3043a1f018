"""End to end with a real Prometheus: it scrapes our ExporterServer and a loopback server replaying a
genuine SGLang 0.5.23 /metrics fixture, evaluates alerts.yml (with `for:` shortened), and answers every
dashboard query with data."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import yaml
from export_samples import LIVE_RATIO, RECOMMENDED_RATIO, drifted_status
from prom_harness import PrometheusServer, wait_for
from promql_refs import (
    ALERTS,
    PENDING_METRICS,
    SGLANG_FIXTURES,
    concrete,
    dashboard_exprs,
    load_dashboard,
    metric_names,
)
from support import LoopbackServer

from advisor.export.server import ExporterServer
from advisor.export.snapshot import SnapshotStore

FIXTURE = SGLANG_FIXTURES / "sglang-0.5.23-single.prom"
SHORT_FOR = "2s"


@pytest.fixture
def fake_sglang() -> Iterator[str]:
    """host:port of a loopback server whose /metrics is the genuine single-GPU SGLang fixture."""
    body = FIXTURE.read_bytes()
    with LoopbackServer({"/metrics": (200, "text/plain; version=0.0.4; charset=utf-8", body, 0.0)}) as server:
        yield server.base_url.removeprefix("http://")


def shortened_rules() -> str:
    """alerts.yml with every `for:` cut to SHORT_FOR, so a 1 s evaluation fires within seconds."""
    document = yaml.safe_load(ALERTS.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
    return yaml.safe_dump(document, sort_keys=False)


def test_real_prometheus_scrapes_queries_and_fires_the_drift_alert(prometheus_server, fake_sglang):
    model_name = re.search(r'model_name="([^"]+)"', FIXTURE.read_text())
    assert model_name
    status = drifted_status(server=fake_sglang, model_name=model_name.group(1), confidence=0.9)
    assert status.recommendation is not None
    # fill the optional advice too, so every dashboard panel has something to show
    status.recommendation = replace(
        status.recommendation, recommended_max_mamba_cache_size=420, recommended_mem_fraction_static=0.88
    )
    status.last_success_timestamp = time.time()
    store = SnapshotStore()
    store.publish([status], now=time.time())

    with ExporterServer(store, "127.0.0.1", 0) as exporter:
        prometheus: PrometheusServer = prometheus_server(
            scrape_targets={"sglang": [fake_sglang], "sglang-pool-advisor": [f"127.0.0.1:{exporter.port}"]},
            rule_files={"alerts.yml": shortened_rules()},
        )

        # 1. the recommendation is queryable with our labels, next to SGLang's own series
        result = wait_for(lambda: prometheus.query("sglang_advisor_recommended_ratio"), timeout=10,
                          what="sglang_advisor_recommended_ratio in Prometheus")
        assert len(result) == 1
        labels = result[0]["metric"]
        assert labels["server"] == fake_sglang and labels["model_name"] == model_name.group(1)
        assert labels["job"] == "sglang-pool-advisor" and "exported_instance" not in labels
        assert float(result[0]["value"][1]) == RECOMMENDED_RATIO
        try:
            running = wait_for(
                lambda: prometheus.query(f'sglang:num_running_reqs{{instance="{fake_sglang}", tp_rank="0"}}'),
                timeout=5, what="the SGLang fixture scraped",
            )
        except TimeoutError as timeout:
            raise AssertionError(f"{timeout}: targets {prometheus.api('targets')['activeTargets']}") from None
        assert [float(series["value"][1]) for series in running] == [45.0]

        # 2. the drift alert goes pending -> firing (for: shortened); no retraction storm at 0.02/s
        seen_states: list[str] = []

        def drift_alert() -> dict | None:
            for alert in prometheus.alerts():
                if alert["labels"]["alertname"] == "SGLangPoolRatioDrift":
                    if not seen_states or seen_states[-1] != alert["state"]:
                        seen_states.append(alert["state"])
                    if alert["state"] == "firing":
                        return alert
            return None

        alert = wait_for(drift_alert, timeout=15, interval=0.25, what="SGLangPoolRatioDrift firing")
        assert seen_states[-1] == "firing" and set(seen_states) <= {"pending", "firing"}
        assert alert["labels"]["server"] == fake_sglang and alert["labels"]["severity"] == "warning"
        description = alert["annotations"]["description"]
        assert f"runs --mamba-full-memory-ratio {LIVE_RATIO:.3g}" in description
        assert f"the advisor recommends {RECOMMENDED_RATIO:.3g}" in description
        assert "--mamba-full-memory-ratio 1.6" in alert["annotations"]["runbook"]
        firing = {a["labels"]["alertname"] for a in prometheus.alerts() if a["state"] == "firing"}
        assert "SGLangRetractionStorm" not in firing and "SGLangAdvisorTargetDown" not in firing

        # 3. every dashboard query runs and returns data (rates need two scrapes: wait for the last one);
        # a query of metrics not exported yet (PENDING_METRICS) must run without error, with no data
        exprs = [concrete(expr) for expr in dashboard_exprs(load_dashboard())]
        pending = [expr for expr in exprs if metric_names(expr) <= PENDING_METRICS]
        assert len(pending) == len(PENDING_METRICS)  # one panel query each, none mixed with live metrics
        for expr in pending:
            assert prometheus.query(expr) == [], expr
        exprs = [expr for expr in exprs if expr not in pending]
        for expr in sorted(exprs, key=lambda e: "rate(" in e):
            series = wait_for(lambda expr=expr: prometheus.query(expr), timeout=5, what=f"data for {expr!r}")
            assert all(series_item["value"][1] not in ("NaN", "+Inf", "-Inf") for series_item in series), expr
