"""The collector's metric contract: names, labels, state sets, omitted Nones, promtool-clean exposition,
and the SnapshotStore's copy and thread-safety guarantees."""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from dataclasses import replace

import pytest
from export_samples import LIVE_RATIO, RECOMMENDED_RATIO, drifted_status, unreachable_status
from prom_harness import run_promtool
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from advisor.export.collector import INFO_LABELS, build_registry, exported_metric_names
from advisor.export.snapshot import ServerView, SnapshotStore
from advisor.recommend.types import DECISIONS, POOLS

NOW = 1_790_000_030.0

# Contract: metric name -> the labels besides server/model_name.
EXTRA_LABELS: dict[str, set[str]] = defaultdict(set)
EXTRA_LABELS.update(
    {
        "sglang_advisor_binding_pool": {"pool"},
        "sglang_advisor_recommended_binding_pool": {"pool"},
        "sglang_advisor_decision": {"state"},
        "sglang_advisor_predicted_max_running_requests": {"config"},
        "sglang_advisor_kv_capacity_requests": {"config"},
        "sglang_advisor_context_length_tokens": {"quantile"},
        "sglang_advisor_info": set(INFO_LABELS),
        "sglang_advisor_scrape_errors_total": {"source"},
    }
)
CONTRACT_NAMES = {
    "sglang_advisor_recommended_ratio", "sglang_advisor_recommended_ratio_lower",
    "sglang_advisor_recommended_ratio_upper", "sglang_advisor_live_ratio", "sglang_advisor_ratio_drift",
    "sglang_advisor_binding_pool", "sglang_advisor_recommended_binding_pool",
    "sglang_advisor_predicted_max_running_requests", "sglang_advisor_kv_capacity_requests",
    "sglang_advisor_predicted_gain_ratio",
    "sglang_advisor_predicted_goodput_gain_ratio",
    "sglang_advisor_goodput_curve_width_ratio", "sglang_advisor_traffic_regime_age_seconds",
    "sglang_advisor_traffic_trend_load_ratio", "sglang_advisor_replay_queue_load_ratio",
    "sglang_advisor_replay_work_scale_ratio",
    "sglang_advisor_context_length_tokens",
    "sglang_advisor_context_length_mean_tokens", "sglang_advisor_context_length_spikiness",
    "sglang_advisor_retractions_per_second", "sglang_advisor_state_pool_saturation_ratio",
    "sglang_advisor_token_equiv", "sglang_advisor_slots_per_request",
    "sglang_advisor_recommended_max_mamba_cache_size", "sglang_advisor_recommended_mem_fraction_static",
    "sglang_advisor_confidence_ratio", "sglang_advisor_decision", "sglang_advisor_target_up",
    "sglang_advisor_last_success_timestamp_seconds", "sglang_advisor_info",
    "sglang_advisor_cycle_duration_seconds", "sglang_advisor_scrape_errors_total",
    "sglang_advisor_observed_max_running_requests", "sglang_advisor_kv_blocked_ratio",
    "sglang_advisor_effective_context_length_tokens", "sglang_advisor_server_restarts_total",
}


def render(store: SnapshotStore) -> str:
    """The per-server contract alone (the daemon's own metrics are tested in test_exporter_server)."""
    return generate_latest(build_registry(store, daemon_metrics=False)).decode()


def samples(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def value_of(text: str, name: str, **labels: str) -> float | None:
    found = [s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, f"{name} {labels} matched {len(found)} samples"
    return found[0] if found else None


@pytest.fixture
def populated() -> SnapshotStore:
    store = SnapshotStore()
    store.publish([drifted_status(), unreachable_status()], now=NOW)
    return store


def test_exported_names_are_the_contract():
    assert set(exported_metric_names()) == CONTRACT_NAMES
    assert len(exported_metric_names()) == len(CONTRACT_NAMES)


def test_every_sample_has_exactly_the_contract_labels(populated):
    rendered = samples(render(populated))
    assert {sample.name for sample in rendered} == CONTRACT_NAMES - {
        "sglang_advisor_recommended_max_mamba_cache_size",  # None in the sample
        "sglang_advisor_recommended_mem_fraction_static",
    }
    for sample in rendered:
        assert ":" not in sample.name and sample.name.startswith("sglang_advisor_")
        assert set(sample.labels) == {"server", "model_name"} | EXTRA_LABELS[sample.name], sample
        assert "instance" not in sample.labels and "job" not in sample.labels
        assert sample.timestamp is None, f"{sample.name} carries a timestamp"
        assert math.isfinite(sample.value)


def test_values_follow_the_snapshot(populated):
    text = render(populated)
    server = drifted_status().server
    assert value_of(text, "sglang_advisor_recommended_ratio", server=server) == RECOMMENDED_RATIO
    assert value_of(text, "sglang_advisor_live_ratio", server=server) == LIVE_RATIO
    assert value_of(text, "sglang_advisor_ratio_drift", server=server) == pytest.approx(
        math.log(LIVE_RATIO / RECOMMENDED_RATIO)
    )
    assert value_of(text, "sglang_advisor_predicted_max_running_requests", server=server, config="live") == 51
    assert value_of(text, "sglang_advisor_predicted_max_running_requests", server=server, config="recommended") == 83
    assert value_of(text, "sglang_advisor_kv_capacity_requests", server=server, config="live") == 128.3
    assert value_of(text, "sglang_advisor_context_length_tokens", server=server, quantile="0.99") == 31000
    assert value_of(text, "sglang_advisor_target_up", server=server) == 1
    assert value_of(text, "sglang_advisor_target_up", server="10.0.0.8:30000") == 0
    assert value_of(text, "sglang_advisor_scrape_errors_total", server=server, source="metrics") == 3
    assert value_of(text, "sglang_advisor_scrape_errors_total", server="10.0.0.8:30000", source="metrics") == 12
    info = value_of(text, "sglang_advisor_info", server=server, version="0.5.23", tp="8", kv_dtype="fp8_e4m3")
    assert info == 1


def test_state_sets_sum_to_one_and_mark_the_current_state(populated):
    rendered = samples(render(populated))
    for name, label, states, current in (
        ("sglang_advisor_binding_pool", "pool", POOLS, "state"),
        ("sglang_advisor_recommended_binding_pool", "pool", POOLS, "balanced"),
        ("sglang_advisor_decision", "state", DECISIONS, "raise_ratio"),
    ):
        members = {s.labels[label]: s.value for s in rendered if s.name == name}
        assert set(members) == set(states)
        assert sum(members.values()) == 1
        assert members[current] == 1


def test_a_target_without_recommendation_exports_only_what_it_has(populated):
    rendered = [s for s in samples(render(populated)) if s.labels["server"] == "10.0.0.8:30000"]
    assert {s.name for s in rendered} == {
        "sglang_advisor_target_up", "sglang_advisor_info", "sglang_advisor_scrape_errors_total",
        "sglang_advisor_server_restarts_total",
    }
    assert all(s.labels["model_name"] == "" for s in rendered)


def test_none_nan_and_garbage_values_are_omitted_not_exported():
    status = drifted_status()
    assert status.recommendation is not None
    status.recommendation.ratio = float("nan")
    status.recommendation.live_ratio = float("inf")
    status.recommendation.token_equiv = "lots"  # type: ignore[assignment]
    status.recommendation.binding_pool_live = "mystery"  # not a pool: the whole state set is left out
    status.workload.context_length_p90 = None
    store = SnapshotStore()
    store.publish([status], now=NOW)
    text = render(store)
    names = {s.name for s in samples(text)}
    assert "sglang_advisor_recommended_ratio" not in names
    assert "sglang_advisor_live_ratio" not in names
    assert "sglang_advisor_token_equiv" not in names
    assert "sglang_advisor_binding_pool" not in names
    assert "sglang_advisor_recommended_binding_pool" in names
    quantiles = {s.labels["quantile"] for s in samples(text) if s.name == "sglang_advisor_context_length_tokens"}
    assert quantiles == {"0.5", "0.99"}
    assert "NaN" not in text and "Inf" not in text


def test_series_of_a_dropped_target_disappear_on_the_next_publish(populated):
    assert "10.0.0.8:30000" in render(populated)
    populated.publish([drifted_status()], now=NOW + 60)
    assert "10.0.0.8:30000" not in render(populated)


def test_own_registry_not_the_global_one(populated):
    render(populated)
    assert "sglang_advisor_" not in generate_latest(REGISTRY).decode()


@pytest.mark.parametrize("which", ["populated", "empty"])
def test_promtool_check_metrics_is_clean(which, populated):
    store = populated if which == "populated" else SnapshotStore()
    text = render(store)
    result = run_promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_store_publish_copies_and_validates():
    store = SnapshotStore()
    assert store.latest() == [] and store.generated_at is None
    status = drifted_status()
    store.publish([status], now=NOW)
    assert status.recommendation is not None
    status.recommendation.ratio = 9.0  # the daemon keeps mutating its own object
    assert value_of(render(store), "sglang_advisor_recommended_ratio") == RECOMMENDED_RATIO
    assert store.generated_at == NOW and store.snapshot().publishes == 1
    with pytest.raises(ValueError, match="appears twice"):
        store.publish([drifted_status(), drifted_status()], now=NOW)
    with pytest.raises(ValueError, match="finite unix time"):
        store.publish([], now=float("nan"))
    with pytest.raises(ValueError, match="expected TargetStatus"):
        store.publish([{"server": "x"}], now=NOW)  # type: ignore[list-item]
    assert store.snapshot().publishes == 1  # failed publishes leave the snapshot alone


def test_concurrent_publish_and_scrape_see_whole_snapshots():
    """Each publish is one generation; a scrape must never mix two generations' series."""
    store = SnapshotStore()
    registry = build_registry(store)
    stop = threading.Event()
    errors: list[str] = []

    def publisher() -> None:
        generation = 0
        while not stop.is_set():
            generation += 1
            statuses = [
                replace(drifted_status(server=f"10.0.0.{i}:30000"), last_cycle_duration_seconds=float(generation))
                for i in range(5)
            ]
            store.publish(statuses, now=NOW + generation)

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        for _ in range(50):
            durations = {
                s.value for s in samples(generate_latest(registry).decode())
                if s.name == "sglang_advisor_cycle_duration_seconds"
            }
            if len(durations) > 1:
                errors.append(f"mixed generations {sorted(durations)}")
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert store.snapshot().publishes > 0


def test_detected_server_restarts_are_a_counter_per_server():
    status = drifted_status()
    status.restarts_total = 3
    store = SnapshotStore()
    store.publish([status, unreachable_status()], now=NOW)
    text = render(store)
    assert value_of(text, "sglang_advisor_server_restarts_total", server=status.server) == 3
    assert value_of(text, "sglang_advisor_server_restarts_total", server=unreachable_status().server) == 0


def test_a_view_published_again_is_not_copied_again_and_a_status_always_is():
    store = SnapshotStore()
    view = ServerView(status=drifted_status(server="a:1"))
    status = drifted_status(server="b:1")
    store.publish([view, status], now=NOW)
    first = store.snapshot().views
    status.model_name = "changed in place"
    store.publish([view, status], now=NOW + 1)
    second = store.snapshot().views
    assert second[0] is first[0]  # the same cycle's view: its copy stands
    assert second[1] is not first[1] and second[1].status.model_name == "changed in place"
    assert first[1].status.model_name != "changed in place"  # what was published is not changed by the daemon
