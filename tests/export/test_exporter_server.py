"""ExporterServer over real loopback HTTP: /metrics, the landing page, /status JSON, 404s, start/stop."""

from __future__ import annotations

import json
import socket

import pytest
import requests
from export_samples import RECOMMENDED_RATIO, drifted_status, unreachable_status
from prometheus_client.parser import text_string_to_metric_families

from advisor.errors import InputError
from advisor.export.server import ExporterServer, landing_page
from advisor.export.snapshot import ServerView, SnapshotStore, history_point

NOW = 1_790_000_030.0


@pytest.fixture
def store() -> SnapshotStore:
    snapshot = SnapshotStore()
    snapshot.publish([drifted_status(), unreachable_status()], now=NOW)
    return snapshot


@pytest.fixture
def exporter(store):
    with ExporterServer(store, "127.0.0.1", 0) as server:
        yield server


def test_metrics_endpoint_serves_the_exposition(exporter):
    response = requests.get(f"{exporter.url}/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    ratio = families["sglang_advisor_recommended_ratio"].samples
    assert [(s.labels["server"], s.value) for s in ratio] == [(drifted_status().server, RECOMMENDED_RATIO)]


def test_metrics_follow_the_latest_publish_without_recomputing(exporter, store):
    def per_server(body: str) -> list[str]:  # process_* metrics move between scrapes; ours must not
        return [line for line in body.splitlines() if 'server="' in line]

    first = per_server(requests.get(f"{exporter.url}/metrics", timeout=5).text)
    assert first and per_server(requests.get(f"{exporter.url}/metrics", timeout=5).text) == first
    store.publish([drifted_status(decision="hold")], now=NOW + 60)
    body = requests.get(f"{exporter.url}/metrics", timeout=5).text
    assert 'sglang_advisor_decision{model_name="Qwen/Qwen3-Next-80B-A3B-Instruct",server="10.0.0.7:30000",state="hold"} 1.0' in body
    assert "10.0.0.8:30000" not in body


def test_landing_page_shows_decision_ratios_pool_and_links(exporter):
    response = requests.get(f"{exporter.url}/", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    page = response.text
    row = next(line for line in page.splitlines() if "10.0.0.7:30000" in line)
    assert "raise_ratio" in row and "1.6" in row and "0.9" in row and "state → balanced" in row
    assert 'href="/metrics"' in page and 'href="/status"' in page
    assert "10.0.0.8:30000" in page and "down" in page


def test_landing_page_writes_times_as_utc_dates_with_their_age(store):
    status = drifted_status()
    status.last_restart_timestamp = NOW - 3 * 3600
    history = tuple(history_point(status.recommendation, moment) for moment in (NOW - 60, NOW))
    store.publish([ServerView(status, history=history)], now=NOW)
    page = landing_page(store, now=NOW + 42)
    assert "Last snapshot: 2026-09-21 14:13:50 UTC (42 s ago)." in page
    # drifted_status's last success is 30 s before the snapshot; the history ends at the last cycle
    assert "last successful cycle 2026-09-21 14:13:20 UTC (72 s ago)" in page
    assert "the history chart ends at 2026-09-21 14:13:50 UTC (42 s ago)" in page
    assert "SGLang restart seen 2026-09-21 11:13:50 UTC (3 h ago)" in page
    for moment in (NOW, NOW - 30, NOW - 3 * 3600):  # never as raw unix seconds
        assert f"{moment:.0f}" not in page and f"{moment}" not in page


def test_landing_page_over_http_dates_the_snapshot(exporter):
    page = requests.get(f"{exporter.url}/", timeout=5).text
    assert "Last snapshot: 2026-09-21 14:13:50 UTC (" in page and " ago)." in page
    assert "last successful cycle 2026-09-21 14:13:20 UTC (" in page
    assert "last successful cycle never" in page  # the unreachable server never had one


def test_landing_page_escapes_html_and_handles_empty_store():
    store = SnapshotStore()
    with ExporterServer(store, "127.0.0.1", 0) as server:
        assert "no cycle has completed yet" in requests.get(server.url, timeout=5).text
        store.publish([unreachable_status(server="<script>alert(1)</script>")], now=NOW)
        page = requests.get(server.url, timeout=5).text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;" in page


def test_status_is_strict_json_with_the_reasoning(exporter, store):
    response = requests.get(f"{exporter.url}/status", timeout=5)
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    document = response.json()
    assert document["generated_at"] == NOW
    first = document["targets"][0]
    assert first["server"] == "10.0.0.7:30000"
    assert first["recommendation"]["reason"].startswith("state pool binds")
    assert first["recommendation"]["flag_line"] == "--mamba-full-memory-ratio 1.6"
    assert first["last_errors"] == ["metrics: connection refused"]
    # a non-finite value becomes null, never the invalid JSON token NaN
    status = drifted_status()
    status.workload.spikiness = float("nan")
    store.publish([status], now=NOW + 1)
    raw = requests.get(f"{exporter.url}/status", timeout=5).text
    assert "NaN" not in raw
    assert json.loads(raw)["targets"][0]["workload"]["spikiness"] is None


def test_unknown_path_is_404_and_head_has_no_body(exporter):
    assert requests.get(f"{exporter.url}/nope", timeout=5).status_code == 404
    head = requests.head(f"{exporter.url}/metrics", timeout=5)
    assert head.status_code == 200 and head.content == b"" and int(head.headers["Content-Length"]) > 0


def test_query_string_is_ignored(exporter):
    assert requests.get(f"{exporter.url}/status?pretty=1", timeout=5).json()["generated_at"] == NOW


def test_stop_closes_the_port(store):
    server = ExporterServer(store, "127.0.0.1", 0).start()
    port = server.port
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_busy_port_and_bad_port_are_one_line_errors(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError, match=rf"cannot listen on 127.0.0.1:{port}"):
            ExporterServer(store, "127.0.0.1", port).start()
    with pytest.raises(InputError, match="0..65535"):
        ExporterServer(store, "127.0.0.1", 70000)


def test_landing_page_charts_the_most_drifted_servers_and_one_on_request():
    from advisor.export.server import CHARTED_SERVERS

    statuses = []
    for index in range(CHARTED_SERVERS + 3):
        status = drifted_status(server=f"10.0.1.{index}:30000")
        assert status.recommendation is not None
        status.recommendation.ratio_drift = 0.01 * index  # the last ones drift most
        statuses.append(status)
    store = SnapshotStore()
    store.publish(statuses, now=NOW)
    with ExporterServer(store, "127.0.0.1", 0) as server:
        page = requests.get(server.url, timeout=5).text
        one = requests.get(f"{server.url}/?server=10.0.1.0%3A30000", timeout=5).text
        missing = requests.get(f"{server.url}/?server=nowhere", timeout=5).text
    charted = [line for line in page.splitlines() if line.startswith('<section id="server-')]
    assert len(charted) == CHARTED_SERVERS
    assert "<h2>10.0.1.14:30000</h2>" in charted[0] and "10.0.1.0:30000</h2>" not in page
    assert page.count('href="/?server=10.0.1.') == CHARTED_SERVERS + 3  # every row links to its charts
    assert [line for line in one.splitlines() if line.startswith("<section")][0].count("<h2>10.0.1.0:30000</h2>") == 1
    assert "no server nowhere in the last snapshot" in missing
