"""One target's cycle: scrape, follow logs, estimate, recommend (the VPA recommender's RunOnce, per server).

The only place that sequences sources (I/O) and the pure rooms. Every failure is counted per source and kept as
a one-line message; the last good estimate stays and is marked stale. Nothing here raises out of `cycle`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from advisor.config import AdvisorConfig, TargetConfig
from advisor.errors import InputError
from advisor.estimate.deltas import CounterTracker, ObservationDelta
from advisor.estimate.steptime import StepTimeEstimator
from advisor.estimate.traffic import TrafficEstimator, TrafficSettings
from advisor.estimate.workload import EstimatorSettings, WorkloadEstimator
from advisor.feeder import (
    ByteOverrides,
    exact_requests,
    model_name_of,
    observe_traffic_interval,
    observed_clamp,
    scheduler_server,
    scrape_sample,
    server_model,
    serving_config_of,
    step_samples_from_log,
    step_samples_from_metrics,
)
from advisor.model.serving import ServingConfig, spec_enabled
from advisor.recommend.engine import (
    RecommenderSettings,
    ServerModel,
    WorkloadPicture,
    live_ratio_of,
    prior_ratio,
    recommend,
)
from advisor.recommend.replay import ReplayCurve, replay_curve
from advisor.recommend.types import Recommendation
from advisor.sources.bootlog import BootInfo, read_boot_log
from advisor.sources.follow import LogFollower
from advisor.sources.http import HttpClient
from advisor.sources.loglines import LogLineParser, digest
from advisor.sources.metrics import MetricsLimits, MetricsObservation
from advisor.sources.scrape import scrape_metrics, scrape_server_info
from advisor.sources.server_info import ServerInfo
from advisor.status import TargetStatus

SOURCES = ("metrics", "server_info", "logs", "boot_log", "checkpoint", "internal")


@dataclass
class CycleReport:
    """What one cycle saw, for `--once`, `inspect` and tests."""

    metrics: MetricsObservation | None = None
    delta: ObservationDelta | None = None
    server_info: ServerInfo | None = None
    boot: BootInfo | None = None
    request_records: int = 0
    log_retractions: int = 0
    errors: list[str] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)  # logs, metrics, server_info, recommend


class TargetPipeline:
    def __init__(self, target: TargetConfig, config: AdvisorConfig) -> None:
        self.target = target
        self.config = config
        self.client = HttpClient(timeout_seconds=config.timeout_seconds, api_key=target.api_key,
                                 max_body_bytes=config.max_body_bytes)
        self.metrics_limits = MetricsLimits(config.max_line_bytes, config.max_labels_per_series, config.max_series)
        self.counters = CounterTracker()  # honest deltas across restarts and a URL flipping between servers
        self.estimator_settings = EstimatorSettings(half_life_seconds=config.half_life_seconds)
        self.recommender_settings = RecommenderSettings(state_bias=config.state_bias)
        self.estimator = WorkloadEstimator(self.estimator_settings)
        self.traffic = TrafficEstimator(TrafficSettings(window_seconds=config.replay_window_seconds))
        self.step_time = StepTimeEstimator(config.half_life_seconds)
        self.uses_decode_lines = False
        self.replay_result: ReplayCurve | None = None
        self.replay_time: float | None = None
        self.last_scrape_now: float | None = None  # when the previous good scrape was taken (advisor clock)
        self.followers = [LogFollower(path, max_line_bytes=config.max_line_bytes) for path in target.log_paths]
        self.log_parser = LogLineParser()
        self.previous: MetricsObservation | None = None
        self.server_info: ServerInfo | None = None
        self.boot: BootInfo | None = None
        self.uses_request_logs = False
        self.restored = False
        self.cycles = 0
        self.consecutive_failures = 0
        self.last_success: float | None = None
        self.errors_total: dict[str, int] = {source: 0 for source in SOURCES}
        self.last_errors: list[str] = []
        self.last_recommendation: Recommendation | None = None
        self.info_due = True
        self._serving_error = ""
        if target.boot_log:
            try:
                self.boot = read_boot_log(target.boot_log)
            except InputError as exc:
                self._error("boot_log", str(exc))

    # -- checkpoint -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator.to_dict(),
            "traffic": self.traffic.to_dict(),
            "step_time": self.step_time.to_dict(),
            "followers": {f.path: f.state() for f in self.followers},
            "uses_request_logs": self.uses_request_logs,
            "errors_total": dict(self.errors_total),
            "last_success": self.last_success,
        }

    def restore(self, state: dict[str, Any]) -> None:
        try:
            estimator = WorkloadEstimator.from_dict(state["estimator"], self.estimator_settings)
        except (KeyError, TypeError, ValueError) as exc:
            self._error("checkpoint", f"checkpoint for {self.target.name} unusable ({exc}); starting cold")
            return
        self.estimator = estimator
        try:
            if "traffic" in state:
                self.traffic = TrafficEstimator.from_dict(state["traffic"])
            if "step_time" in state:
                self.step_time = StepTimeEstimator.from_dict(state["step_time"])
        except (KeyError, TypeError, ValueError) as exc:
            self._error("checkpoint", f"checkpoint for {self.target.name}: replay inputs unusable ({exc}); relearning them")
        for follower in self.followers:
            saved = state.get("followers", {}).get(follower.path)
            if isinstance(saved, dict):
                follower.restore(saved)
        self.uses_request_logs = bool(state.get("uses_request_logs", False))
        for source, count in dict(state.get("errors_total", {})).items():
            if source in self.errors_total and isinstance(count, int):
                self.errors_total[source] = count
        if isinstance(state.get("last_success"), (int, float)):
            self.last_success = float(state["last_success"])
        self.restored = True

    # -- the cycle ------------------------------------------------------------------------------------

    def _error(self, source: str, message: str) -> None:
        self.errors_total[source] = self.errors_total.get(source, 0) + 1
        self.last_errors.append(f"{source}: {message}")

    def cycle(self, now: float) -> tuple[TargetStatus, CycleReport]:
        started = time.monotonic()
        self.cycles += 1
        self.last_errors = []
        report = CycleReport()
        self._read_logs(now, report)
        step = time.monotonic()
        report.step_seconds["logs"] = step - started
        scraped = self._scrape(now, report)
        report.step_seconds["metrics"] = time.monotonic() - step
        if scraped:
            self.consecutive_failures = 0
            self.last_success = now
        else:
            self.consecutive_failures += 1
        if self.info_due or self.cycles % max(1, self.config.server_info_every) == 0:
            step = time.monotonic()
            self._refresh_server_info(report)
            report.step_seconds["server_info"] = time.monotonic() - step
        report.server_info = self.server_info
        report.boot = self.boot
        report.errors = list(self.last_errors)
        step = time.monotonic()
        status = self._status(now)
        report.step_seconds["recommend"] = time.monotonic() - step
        status.last_cycle_duration_seconds = time.monotonic() - started
        return status, report

    def _read_logs(self, now: float, report: CycleReport) -> None:
        lengths: list[tuple[int, int]] = []
        for follower in self.followers:
            cut = follower.cut_lines
            try:
                lines = follower.read_lines()
            except OSError as exc:
                self._error("logs", f"{follower.path}: {exc.strerror or exc}")
                continue
            if follower.cut_lines > cut:
                self._error("logs", f"{follower.path}: {follower.cut_lines - cut} line(s) longer than "
                                    f"max_line_bytes={follower.max_line_bytes} cut")
            bad_before, abandoned_before = self.log_parser.bad_request_lines, self.log_parser.abandoned_boot_blocks
            found = digest(self.log_parser.feed(lines), source=follower.path)
            if self.log_parser.abandoned_boot_blocks > abandoned_before:  # never finished, or over its line/byte cap
                self._error("logs", f"{follower.path}: boot block given up (no caps line; superseded or too long)")
            # request-log lines that gave no record (the parser counts them): skipped, counted, the rest kept
            bad = self.log_parser.bad_request_lines - bad_before
            if bad > 0:
                self._error("logs", f"{follower.path}: {bad} unreadable request-log line(s) skipped")
            lengths.extend(found.request_lengths)
            self.traffic.observe_requests(exact_requests(found.requests, self.config.time_scale))
            if found.decode_intervals:
                self.uses_decode_lines = True
                self.step_time.observe(now, step_samples_from_log(found.decode_intervals))
            report.log_retractions += found.retracted_requests
            for error in found.errors:
                self._error("logs", error)
            if found.boot is not None:
                self.boot = found.boot
                self.info_due = True
        if lengths:
            self.uses_request_logs = True
            report.request_records = self.estimator.observe_requests(now, lengths)

    def fetch_metrics(self) -> tuple[MetricsObservation | None, str | None]:
        """This cycle's observation (a store-fed pipeline overrides this and `fetch_server_info`)."""
        return scrape_metrics(self.client, self.target.url, self.metrics_limits)

    def fetch_server_info(self) -> tuple[ServerInfo | None, str | None]:
        return scrape_server_info(self.client, self.target.url)

    def _scrape(self, now: float, report: CycleReport) -> bool:
        observation, error = self.fetch_metrics()
        for warning in self.client.take_warnings():  # read, but not as declared (an unusable charset): counted
            self._error("metrics", warning)
        if observation is None:
            self._error("metrics", error or "no observation")
            return False
        interval = now - self.last_scrape_now if self.last_scrape_now is not None else None
        self.last_scrape_now = now
        delta = self.counters.diff(observation, now=now, interval_seconds=interval)
        report.metrics, report.delta = observation, delta
        first = self.previous is None
        self.previous = observation
        if delta.restarted:
            self.info_due = True
        # The first scrape after a checkpoint restore is only a baseline: its lifetime totals were seen before.
        if first and self.restored:
            return True
        if not self.uses_request_logs:
            self.estimator.observe_token_histograms(now, delta.prompt_tokens_histogram, delta.generation_tokens_histogram)
        clamp = observed_clamp(self.server_info, self.boot, len(observation.ranks))
        sample = scrape_sample(observation, delta, clamp=clamp, log_retractions=report.log_retractions, baseline=first)
        self.estimator.observe_scrape(now, sample)
        observe_traffic_interval(self.traffic, now, delta, sample)
        if not self.uses_decode_lines:
            self.step_time.observe(now, step_samples_from_metrics(observation))
        return True

    def _refresh_server_info(self, report: CycleReport) -> None:
        info, error = self.fetch_server_info()
        if info is None:
            self._error("server_info", error or "no server info")
            return
        self.server_info = info
        self.info_due = False

    # -- the model and the recommendation -------------------------------------------------------------

    def server_model(self) -> ServerModel:
        try:
            serving = serving_config_of(self.server_info, self.boot)
        except InputError as exc:
            if str(exc) != self._serving_error:  # count a bad boot-log server_args once, not every cycle
                self._error("boot_log", str(exc))
            self._serving_error = str(exc)
            serving = ServingConfig()
        if self.target.skip_decode_lock is not None:
            serving = serving.with_skip_decode_lock(self.target.skip_decode_lock)
        overrides = ByteOverrides(self.target.state_bytes_per_slot, self.target.kv_bytes_per_token, self.target.rest_gib)
        return server_model(serving, self.server_info, self.boot, self.previous, overrides)

    def _status(self, now: float) -> TargetStatus:
        stale = self.consecutive_failures >= self.config.stale_after_cycles
        model = self.server_model()
        picture = WorkloadPicture(
            summary=self.estimator.summary(now),
            context_length=self.estimator.time_averaged_context(),
            confidence=self.estimator.confidence(now),
        )
        picture.replay = self._replay(now, model, picture)
        try:
            previous = self.last_recommendation.decision if self.last_recommendation else None
            rec = recommend(model, picture, self.recommender_settings, inputs_stale=stale, previous_decision=previous)
        except (ValueError, ZeroDivisionError) as exc:
            self._error("internal", f"recommendation failed: {exc}")
            rec = Recommendation(decision="insufficient_data", reason=f"cannot compute: {exc}")
        self.last_recommendation = rec
        serving = model.serving
        info = {
            "version": (self.server_info.version if self.server_info else None) or "unknown",
            "strategy": serving.strategy,
            "ssm_dtype": serving.mamba_ssm_dtype or "default",
            "kv_dtype": serving.kv_cache_dtype or "auto",
            "tp": str(serving.tp_size), "dp": str(serving.dp_size), "pp": str(serving.pp_size), "dcp": str(serving.dcp_size),
        }
        model_name = model_name_of(self.server_info, self.previous)
        return TargetStatus(
            server=self.target.name,
            model_name=model_name,
            up=self.consecutive_failures == 0 and self.last_success is not None,
            stale=stale,
            last_success_timestamp=self.last_success,
            info=info,
            workload=picture.summary,
            recommendation=rec,
            scrape_errors_total=dict(self.errors_total),
            last_errors=list(self.last_errors),
            restarts_total=self.counters.restarts_total,
            last_restart_timestamp=self.counters.last_restart_timestamp,
            last_restart_reason=self.counters.last_restart_reason,
        )

    def _replay(self, now: float, model: ServerModel, picture: WorkloadPicture) -> ReplayCurve | None:
        """The what-if replay's curve: recomputed every replay_interval_seconds, reused in between."""
        interval = self.config.replay_interval_seconds
        if interval <= 0:
            return None
        if self.replay_time is not None and now - self.replay_time < interval and self.replay_result is not None:
            return self.replay_result
        prior = prior_ratio(model, picture, self.recommender_settings)
        fit = self.step_time.fit(model.serving.draft_tokens if spec_enabled(model.serving) else 0)
        traffic = self.traffic.picture(seed=self.cycles)
        if prior is None or traffic is None:
            return self.replay_result
        server = scheduler_server(model, self.boot, fit.cost if fit else self.step_time.prior)
        if server is None:
            return self.replay_result
        try:
            self.replay_result = replay_curve(server, traffic, prior_ratio=prior, live_ratio=live_ratio_of(model))
        except (ValueError, ZeroDivisionError) as exc:
            self._error("internal", f"replay failed: {exc}")
            return self.replay_result
        self.replay_time = now
        return self.replay_result

    def close(self) -> None:
        self.client.close()
