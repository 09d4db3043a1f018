"""The cached /metrics renderer: byte-for-byte the families an uncached registry gives, in every format
and with gzip, new content after each publish, and the daemon's own metrics always fresh."""

from __future__ import annotations

import gzip

import pytest
import requests
from export_samples import drifted_status
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from advisor.export.collector import build_registry
from advisor.export.exposition import MetricsRenderer, bake_registry
from advisor.export.server import ExporterServer
from advisor.export.snapshot import SnapshotStore

NOW = 1_790_000_030.0
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _per_server(text: str, openmetrics: bool) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for family in parse(text) for s in family.samples if "server" in s.labels)


@pytest.fixture
def store() -> SnapshotStore:
    snapshot = SnapshotStore()
    snapshot.publish([drifted_status(server=f"10.0.0.{i}:30000") for i in range(5)], now=NOW)
    return snapshot


@pytest.mark.parametrize(("accept", "compress"), [("", False), ("", True), (OPENMETRICS, False), (OPENMETRICS, True)])
def test_cached_equals_uncached_in_every_format(store, accept, compress):
    renderer = MetricsRenderer(store)
    encoding = "gzip" if compress else ""
    reference_headers, reference = bake_registry(build_registry(store), accept, encoding, {})
    for _ in range(2):  # the first render fills the cache, the second is served from it
        headers, body = renderer.render(accept, encoding, {})
        assert dict(headers) == dict(reference_headers)
        text = (gzip.decompress(body) if compress else body).decode()
        expected = (gzip.decompress(reference) if compress else reference).decode()
        openmetrics = bool(accept)
        assert _per_server(text, openmetrics) == _per_server(expected, openmetrics)
        assert "sglang_advisor_build_info" in text and "process_cpu_seconds" in text
        assert text.count("# EOF") == (1 if openmetrics else 0) and (text.endswith("# EOF\n") or not openmetrics)


def test_a_publish_replaces_the_cached_families_and_the_daemon_part_stays_fresh(store):
    renderer = MetricsRenderer(store)
    before = renderer.render("", "", {})[1].decode()
    assert "10.0.0.4:30000" in before
    store.observe_step("cycle", 0.3)
    store.publish([drifted_status(server="10.0.0.9:30000")], now=NOW + 15)
    after = renderer.render("", "", {})[1].decode()
    assert "10.0.0.4:30000" not in after and "10.0.0.9:30000" in after
    assert 'sglang_advisor_cycle_step_duration_seconds_count{step="cycle"} 1.0' in after


def test_http_clients_decode_the_two_gzip_members(store):
    with ExporterServer(store, "127.0.0.1", 0) as exporter:
        response = requests.get(f"{exporter.url}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert response.headers["Content-Encoding"] == "gzip"
    assert "sglang_advisor_recommended_ratio{" in response.text and "sglang_advisor_build_info" in response.text


def test_the_exposition_is_rendered_when_the_cycle_ends_not_on_the_scrape(store, monkeypatch):
    renderer = MetricsRenderer(store)
    renderer.render(OPENMETRICS, "gzip", {})  # the scraper's format, learnt from its first scrape
    store.publish([drifted_status(server="10.0.0.9:30000")], now=NOW + 15)
    assert not renderer.ready()
    store.cycle_ended()
    assert renderer.ready()

    def no_reading(*_args):
        raise AssertionError("a scrape read the snapshot: the exposition was not rendered in the cycle")

    monkeypatch.setattr(store, "latest", no_reading)  # what the collector reads to encode the families
    body = renderer.render(OPENMETRICS, "gzip", {})[1]
    assert "10.0.0.9:30000" in gzip.decompress(body).decode()


def test_a_cycle_end_before_any_scrape_renders_nothing(store):
    renderer = MetricsRenderer(store)
    store.cycle_ended()
    assert renderer.ready() and renderer._cache == {}
