"""export.collector: the Prometheus side of the exporter. AdvisorCollector turns the last published snapshot
(advisor.export.snapshot) into Prometheus metric families (no sample timestamps, nothing recomputed, a None or
non-finite value is simply not exported); the registries add the advisor process's own metrics."""

from __future__ import annotations

import logging
import math
import platform
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from advisor import __version__
from advisor.export.snapshot import METRIC_PREFIX, SnapshotStore, metric_name
from advisor.recommend.types import CONFIGS, DECISIONS, POOLS, Recommendation
from advisor.status import TargetStatus

log = logging.getLogger(__name__)

TARGET_LABELS = ("server", "model_name")
# TargetStatus.info keys exported as labels of sglang_advisor_info (missing keys export as "").
INFO_LABELS = ("version", "strategy", "ssm_dtype", "kv_dtype", "tp", "dp", "pp", "dcp")
# quantile label value -> WorkloadSummary field
CONTEXT_LENGTH_QUANTILES = (
    ("0.5", "context_length_p50"),
    ("0.9", "context_length_p90"),
    ("0.99", "context_length_p99"),
)
_CYCLE_NOTE = " Recomputed once per advisor cycle; a scrape shows the last published snapshot."


def _finite(value: object) -> float | None:
    """A sample value, or None when there is nothing (or nothing sane) to export."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, (int, float)):
        log.warning("not exporting a non-numeric value %r", value)
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _target_labels(status: TargetStatus) -> list[str]:
    return [str(status.server), str(status.model_name or "")]


RecommendationField = Callable[[Recommendation], object]
StatusField = Callable[[TargetStatus], object]


def _from_recommendation(getter: RecommendationField) -> StatusField:
    def read(status: TargetStatus) -> object:
        return None if status.recommendation is None else getter(status.recommendation)

    return read


# (name suffix, HELP, value getter) for the plain per-target gauges.
_GAUGES: tuple[tuple[str, str, StatusField], ...] = (
    (
        "recommended_ratio",
        "Recommended --mamba-full-memory-ratio (state-pool bytes / full-attention KV bytes; "
        "not bounded to [0, 1]).",
        _from_recommendation(lambda r: r.ratio),
    ),
    (
        "recommended_ratio_lower",
        "Lower end of the recommended --mamba-full-memory-ratio band (not bounded to [0, 1]).",
        _from_recommendation(lambda r: r.ratio_lower),
    ),
    (
        "recommended_ratio_upper",
        "Upper end of the recommended --mamba-full-memory-ratio band (not bounded to [0, 1]).",
        _from_recommendation(lambda r: r.ratio_upper),
    ),
    (
        "live_ratio",
        "The --mamba-full-memory-ratio the server runs with (not bounded to [0, 1]).",
        _from_recommendation(lambda r: r.live_ratio),
    ),
    (
        "ratio_drift",
        "Natural log of live ratio / recommended ratio: 0 = on target, > 0 state pool too big, "
        "< 0 state pool too small.",
        _from_recommendation(lambda r: r.ratio_drift),
    ),
    (
        "predicted_gain_ratio",
        "Predicted concurrency at the recommended ratio divided by concurrency at the live ratio "
        "(1 = no gain).",
        _from_recommendation(lambda r: r.predicted_gain_ratio),
    ),
    (
        "predicted_goodput_gain_ratio",
        "Goodput the what-if replay of the server's recent traffic predicts at the recommended ratio divided by "
        "its goodput at the live ratio (1 = no gain).",
        _from_recommendation(lambda r: r.predicted_goodput_gain_ratio),
    ),
    (
        "goodput_curve_width_ratio",
        "Upper over lower end of the ratio range whose replayed goodput is within noise of the best "
        "(how much the exact ratio matters; 1 = a sharp optimum).",
        _from_recommendation(lambda r: r.goodput_curve_width_ratio),
    ),
    (
        "traffic_regime_age_seconds",
        "Seconds the traffic had been in its current regime at the what-if replay's end, where it changed character "
        "inside the replay's window (absent: one regime); the new regime's replay then decides with the window's.",
        _from_recommendation(lambda r: r.replay_regime_seconds),
    ),
    (
        "traffic_trend_load_ratio",
        "Arrival rate of the what-if replay window's last minutes over the window's, where the same traffic came "
        "faster (absent: no trend); the window is then replayed that much heavier too and decides with the observed.",
        _from_recommendation(lambda r: r.replay_trend_load),
    ),
    (
        "replay_queue_load_ratio",
        "How much heavier the what-if replay ran its window so that, at the live ratio, as many requests waited "
        "beyond its queue bound as the server's queue-time histogram showed (absent: the replay queued as much "
        "without); that heavier traffic then decides with the window, as a trend's does.",
        _from_recommendation(lambda r: r.replay_queue_load),
    ),
    (
        "replay_work_scale_ratio",
        "Factor the what-if replay scaled its metrics-only picture's output lengths by so that, at the live ratio, it "
        "admits requests at the rate the server's queue-time histogram counted (absent: it did without, or the "
        "lengths came from request logs); a full pool (slots or KV) admits at the turnover the outputs set.",
        _from_recommendation(lambda r: r.replay_work_scale),
    ),
    (
        "observed_max_running_requests",
        "max_running_requests the server reports per DP worker (its effective concurrency clamp).",
        _from_recommendation(lambda r: r.observed_max_running_requests),
    ),
    (
        "context_length_mean_tokens",
        "Recency-weighted mean context length (prompt + output) of finished requests, in tokens.",
        lambda s: s.workload.context_length_mean,
    ),
    (
        "effective_context_length_tokens",
        "Context length the KV pool effectively sees per running request (residence-weighted final context: "
        "a request holds KV for as long as it decodes), in tokens.",
        lambda s: s.workload.effective_context_length,
    ),
    (
        "context_length_spikiness",
        "Spikiness of the context-length distribution (0 = steady; higher = heavier tail / bursts).",
        lambda s: s.workload.spikiness,
    ),
    (
        "retractions_per_second",
        "Recency-weighted rate of request retractions (KV pool full), per second.",
        lambda s: s.workload.retractions_per_second,
    ),
    (
        "state_pool_saturation_ratio",
        "Fraction of time the running requests sat at the state-pool clamp with a queue waiting.",
        lambda s: s.workload.state_pool_saturation_ratio,
    ),
    (
        "kv_blocked_ratio",
        "Fraction of time a queue waited while running requests were below the state-pool clamp "
        "(KV pool binding).",
        lambda s: s.workload.kv_blocked_ratio,
    ),
    (
        "token_equiv",
        "Bytes of one recurrent-state slot expressed in KV tokens (token_equiv in r* = (S + D) * "
        "token_equiv * dcp / L).",
        _from_recommendation(lambda r: r.token_equiv),
    ),
    (
        "slots_per_request",
        "State-pool slots one request holds (1 + speculative/overlap extras, S + D).",
        _from_recommendation(lambda r: r.slots_per_request),
    ),
    (
        "recommended_max_mamba_cache_size",
        "Recommended --max-mamba-cache-size (state-pool slots) to pin the state pool, when advised.",
        _from_recommendation(lambda r: r.recommended_max_mamba_cache_size),
    ),
    (
        "recommended_mem_fraction_static",
        "Recommended --mem-fraction-static, when advised.",
        _from_recommendation(lambda r: r.recommended_mem_fraction_static),
    ),
    (
        "confidence_ratio",
        "Advisor's confidence in the recommendation, 0 to 1 (data volume and stability).",
        _from_recommendation(lambda r: r.confidence),
    ),
    (
        "target_up",
        "1 if the advisor's last cycle could read the SGLang server, else 0.",
        lambda s: s.up,
    ),
    (
        "last_success_timestamp_seconds",
        "Unix time of the advisor's last successful cycle for this server.",
        lambda s: s.last_success_timestamp,
    ),
    (
        "cycle_duration_seconds",
        "Wall-clock duration of the advisor's last cycle for this server, in seconds.",
        lambda s: s.last_cycle_duration_seconds,
    ),
)

# (name suffix, label, HELP, getter, states) for the state sets (1 for the current state, 0 for the others).
_STATE_SETS: tuple[tuple[str, str, str, StatusField, tuple[str, ...]], ...] = (
    (
        "binding_pool",
        "pool",
        "Pool that caps concurrency at the live ratio (1 for the binding pool, 0 for the others).",
        _from_recommendation(lambda r: r.binding_pool_live),
        POOLS,
    ),
    (
        "recommended_binding_pool",
        "pool",
        "Pool that would cap concurrency at the recommended ratio (1 for the binding pool, 0 for the others).",
        _from_recommendation(lambda r: r.binding_pool_recommended),
        POOLS,
    ),
    (
        "decision",
        "state",
        "The advisor's decision for this server (1 for the current decision, 0 for the others).",
        _from_recommendation(lambda r: r.decision),
        DECISIONS,
    ),
)

# (name suffix, HELP, getter per config) for the live-vs-recommended pairs.
_PER_CONFIG: tuple[tuple[str, str, dict[str, StatusField]], ...] = (
    (
        "predicted_max_running_requests",
        "Predicted max running requests (the concurrency clamp) at the live or recommended config.",
        {
            "live": _from_recommendation(lambda r: r.predicted_max_running_requests_live),
            "recommended": _from_recommendation(lambda r: r.predicted_max_running_requests_recommended),
        },
    ),
    (
        "kv_capacity_requests",
        "Requests of the effective context length the KV pool holds at the live or recommended config.",
        {
            "live": _from_recommendation(lambda r: r.kv_capacity_requests_live),
            "recommended": _from_recommendation(lambda r: r.kv_capacity_requests_recommended),
        },
    ),
)
assert all(set(getters) == set(CONFIGS) for _, _, getters in _PER_CONFIG)


class AdvisorCollector:
    """A prometheus_client collector over a SnapshotStore; builds fresh families on every collect()."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store

    def describe(self) -> Iterable[Metric]:
        """The families without samples, so a registry can check names without reading the store."""
        return list(self._families(()))

    def collect(self) -> Iterable[Metric]:
        targets = sorted(self._store.latest(), key=lambda status: str(status.server))
        return list(self._families(targets))

    def _families(self, targets: Sequence[TargetStatus]) -> Iterator[Metric]:
        for suffix, help_text, getter in _GAUGES:
            gauge = GaugeMetricFamily(metric_name(suffix), help_text + _CYCLE_NOTE, labels=TARGET_LABELS)
            for status in targets:
                value = _finite(getter(status))
                if value is not None:
                    gauge.add_metric(_target_labels(status), value)
            yield gauge

        for suffix, label, help_text, state_getter, states in _STATE_SETS:
            state_set = GaugeMetricFamily(
                metric_name(suffix), help_text + _CYCLE_NOTE, labels=(*TARGET_LABELS, label)
            )
            for status in targets:
                current = state_getter(status)
                if current is None:
                    continue
                if current not in states:
                    log.warning("server %s: %s %r is not one of %s; not exported", status.server, suffix,
                                current, ", ".join(states))
                    continue
                for state in states:
                    state_set.add_metric([*_target_labels(status), state], 1.0 if state == current else 0.0)
            yield state_set

        for suffix, help_text, getters in _PER_CONFIG:
            paired = GaugeMetricFamily(
                metric_name(suffix), help_text + _CYCLE_NOTE, labels=(*TARGET_LABELS, "config")
            )
            for status in targets:
                for config in CONFIGS:
                    value = _finite(getters[config](status))
                    if value is not None:
                        paired.add_metric([*_target_labels(status), config], value)
            yield paired

        yield self._context_length_quantiles(targets)
        yield self._info(targets)
        yield self._scrape_errors(targets)
        yield self._server_restarts(targets)

    @staticmethod
    def _context_length_quantiles(targets: Sequence[TargetStatus]) -> Metric:
        # Typed summary (quantiles only, no _sum/_count: the window decays, so there is no
        # monotonic count) because Prometheus reserves the `quantile` label for summaries.
        name = metric_name("context_length_tokens")
        family = Metric(
            name,
            "Recency-weighted quantiles of the context length (prompt + output) of finished requests, "
            "in tokens; no _sum/_count, see sglang_advisor_context_length_mean_tokens." + _CYCLE_NOTE,
            "summary",
        )
        for status in targets:
            server, model_name = _target_labels(status)
            for quantile, field_name in CONTEXT_LENGTH_QUANTILES:
                value = _finite(getattr(status.workload, field_name))
                if value is not None:
                    family.add_sample(
                        name, {"server": server, "model_name": model_name, "quantile": quantile}, value
                    )
        return family

    @staticmethod
    def _info(targets: Sequence[TargetStatus]) -> Metric:
        family = InfoMetricFamily(
            METRIC_PREFIX,
            "Serving facts the recommendation assumed: SGLang version, speculative/overlap strategy, "
            "state and KV dtypes, tp/dp/pp/dcp sizes (always 1).",
            labels=TARGET_LABELS,
        )
        for status in targets:
            info = status.info if isinstance(status.info, dict) else {}
            family.add_metric(
                _target_labels(status), {key: str(info.get(key, "") or "") for key in INFO_LABELS}
            )
        return family

    @staticmethod
    def _scrape_errors(targets: Sequence[TargetStatus]) -> Metric:
        family = CounterMetricFamily(
            metric_name("scrape_errors_total"),
            "Failed reads of this server's inputs since the advisor started, by source "
            "(metrics, server_info, logs, ...).",
            labels=(*TARGET_LABELS, "source"),
        )
        for status in targets:
            errors = status.scrape_errors_total if isinstance(status.scrape_errors_total, dict) else {}
            for source in sorted(errors, key=str):
                value = _finite(errors[source])
                if value is not None:
                    family.add_metric([*_target_labels(status), str(source)], value)
        return family


    @staticmethod
    def _server_restarts(targets: Sequence[TargetStatus]) -> Metric:
        family = CounterMetricFamily(
            metric_name("server_restarts"),
            "Restarts of this SGLang server the advisor detected since it started (counters reset, series or "
            "constants changed, or the URL answering for another server); the deltas rebase instead of "
            "re-adding lifetime totals.",
            labels=TARGET_LABELS,
        )
        for status in targets:
            value = _finite(status.restarts_total)
            if value is not None:
                family.add_metric(list(_target_labels(status)), value)
        return family


def exported_metric_names() -> list[str]:
    """Every metric name the collector exports, as written in PromQL (counters end in _total)."""
    suffix_by_type = {"counter": "_total", "info": "_info"}
    return [
        family.name + suffix_by_type.get(family.type, "")
        for family in AdvisorCollector(SnapshotStore()).describe()
    ]


class BuildInfoCollector:
    """sglang_advisor_build_info: the advisor's version and the Python it runs on, value 1."""

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        family = InfoMetricFamily(
            metric_name("build"), "The advisor's version and the Python interpreter running it (always 1).",
            labels=("version", "python_version"),
        )
        family.add_metric([__version__, platform.python_version()], {})
        return [family]


def daemon_metric_names() -> list[str]:
    """Metric names about the advisor process itself (not per SGLang server), as written in PromQL."""
    return [metric_name("build_info"), metric_name("cycle_step_duration_seconds_bucket")]


def _register_daemon_metrics(registry: CollectorRegistry, store: SnapshotStore) -> None:
    registry.register(BuildInfoCollector())
    registry.register(store.step_durations)
    ProcessCollector(registry=registry)


def build_registry(store: SnapshotStore, *, daemon_metrics: bool = True) -> CollectorRegistry:
    """Our own registry (never the global one): the per-server advisor collector and, with
    `daemon_metrics`, build info, the cycle-step histogram and the standard process_* metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AdvisorCollector(store))
    if daemon_metrics:
        _register_daemon_metrics(registry, store)
    return registry


def build_daemon_registry(store: SnapshotStore) -> CollectorRegistry:
    """Only the advisor process's own metrics (no per-server families)."""
    registry = CollectorRegistry(auto_describe=False)
    _register_daemon_metrics(registry, store)
    return registry
