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
from advisor.estimate.deltas import ObservationDelta, diff_counters
from advisor.estimate.workload import EstimatorSettings, ScrapeSample, WorkloadEstimator
from advisor.model.advice import MemoryFacts
from advisor.model.pools import GIB, ByteConstants
from advisor.model.serving import ServingConfig
from advisor.recommend.engine import RecommenderSettings, ServerModel, WorkloadPicture, recommend
from advisor.recommend.types import Recommendation
from advisor.sources.bootlog import BootInfo, read_boot_log
from advisor.sources.follow import LogFollower
from advisor.sources.http import HttpClient
from advisor.sources.loglines import LogLineParser, digest
from advisor.sources.metrics import MetricsObservation, parse_metrics
from advisor.sources.server_info import ServerInfo, fetch_server_info, parse_server_info
from advisor.status import TargetStatus

SOURCES = ("metrics", "server_info", "logs", "boot_log", "checkpoint")


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


def constants_from_server_info(info: ServerInfo) -> tuple[ByteConstants, float] | None:
    """Invert SGLang's split from /server_info: KV bytes and token count give bytes per token; the KV bytes,
    the ratio and max_mamba_cache_size give the slot size (ratio-based pools only; within one slot)."""
    serving = info.serving
    if serving.max_mamba_cache_size is not None or not info.shards:
        return None
    shard = info.shards[0]
    if not (shard.kv_cache_gb and shard.kv_capacity_tokens and shard.max_mamba_cache_size):
        return None
    kv_bytes = shard.kv_cache_gb * GIB
    ratio = serving.mamba_full_memory_ratio
    per_slot = ratio * kv_bytes / (shard.max_mamba_cache_size + 1.5 + 0.5 * ratio)
    per_token = kv_bytes / (shard.kv_capacity_tokens + serving.page_size)
    rest = kv_bytes + (shard.max_mamba_cache_size + 1) * per_slot
    return ByteConstants(per_slot, per_token), rest


class TargetPipeline:
    def __init__(self, target: TargetConfig, config: AdvisorConfig) -> None:
        self.target = target
        self.config = config
        self.client = HttpClient(timeout_seconds=config.timeout_seconds, api_key=target.api_key)
        self.estimator_settings = EstimatorSettings(half_life_seconds=config.half_life_seconds)
        self.recommender_settings = RecommenderSettings(state_bias=config.state_bias)
        self.estimator = WorkloadEstimator(self.estimator_settings)
        self.followers = [LogFollower(path) for path in target.log_paths]
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
        if target.boot_log:
            try:
                self.boot = read_boot_log(target.boot_log)
            except InputError as exc:
                self._error("boot_log", str(exc))

    # -- checkpoint -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator.to_dict(),
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
        scraped = self._scrape(now, report)
        if scraped:
            self.consecutive_failures = 0
            self.last_success = now
        else:
            self.consecutive_failures += 1
        if self.info_due or self.cycles % max(1, self.config.server_info_every) == 0:
            self._refresh_server_info(report)
        report.server_info = self.server_info
        report.boot = self.boot
        report.errors = list(self.last_errors)
        status = self._status(now)
        status.last_cycle_duration_seconds = time.monotonic() - started
        return status, report

    def _read_logs(self, now: float, report: CycleReport) -> None:
        lengths: list[tuple[int, int]] = []
        for follower in self.followers:
            try:
                lines = follower.read_lines()
            except OSError as exc:
                self._error("logs", f"{follower.path}: {exc.strerror or exc}")
                continue
            found = digest(self.log_parser.feed(lines), source=follower.path)
            lengths.extend(found.request_lengths)
            report.log_retractions += found.retracted_requests
            for error in found.errors:
                self._error("logs", error)
            if found.boot is not None:
                self.boot = found.boot
                self.info_due = True
        if lengths:
            self.uses_request_logs = True
            report.request_records = self.estimator.observe_requests(now, lengths)

    def _scrape(self, now: float, report: CycleReport) -> bool:
        result = self.client.get_text(f"{self.target.url}/metrics")
        if not result.ok or not isinstance(result.body, str):
            self._error("metrics", result.error or "empty /metrics body")
            return False
        try:
            observation = parse_metrics(result.body)
        except InputError as exc:
            self._error("metrics", str(exc))
            return False
        delta = diff_counters(self.previous, observation, interval_seconds=None)
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
        self.estimator.observe_scrape(now, self._scrape_sample(observation, delta, report, first))
        return True

    def _scrape_sample(self, obs: MetricsObservation, delta: ObservationDelta, report: CycleReport, first: bool) -> ScrapeSample:
        def total(name: str) -> float | None:
            values = [getattr(rank, name) for rank in obs.ranks if getattr(rank, name) is not None]
            return float(sum(values)) if values else None

        clamp = None
        if self.server_info is not None and self.server_info.shards:
            caps = [s.effective_max_running_requests for s in self.server_info.shards]
            if all(c is not None for c in caps):
                clamp = float(sum(c for c in caps if c is not None))
        if clamp is None and self.boot is not None and self.boot.max_running_requests is not None:
            clamp = float(self.boot.max_running_requests * max(1, len(obs.ranks)))
        retracted = delta.retracted_requests
        retracted_tokens = 0.0
        for rank in delta.ranks:
            retracted_tokens += (rank.retracted_input_tokens or 0.0) + (rank.retracted_output_tokens or 0.0)
        if retracted is None:
            retracted = float(report.log_retractions)
        ratios = [r.new_token_ratio for r in obs.ranks if r.new_token_ratio is not None]
        return ScrapeSample(
            running_requests=total("running_requests") or 0.0,
            queued_requests=total("queued_requests") or 0.0,
            max_running_requests=clamp,
            decode_sum_seq_lens=total("decode_sum_seq_lens"),
            kv_used_tokens=total("kv_used_tokens"),
            kv_capacity_tokens=total("kv_capacity_tokens"),
            state_slots_used=total("state_slots_used"),
            state_pool_slots=total("state_pool_slots"),
            new_token_ratio=sum(ratios) / len(ratios) if ratios else None,
            retracted_requests=0.0 if first else retracted,
            retracted_tokens=0.0 if first else retracted_tokens,
        )

    def _refresh_server_info(self, report: CycleReport) -> None:
        result = fetch_server_info(self.client, self.target.url)
        if not result.ok or not isinstance(result.body, dict):
            self._error("server_info", result.error or "no JSON object from /server_info")
            return
        try:
            self.server_info = parse_server_info(result.body)
            self.info_due = False
        except InputError as exc:
            self._error("server_info", str(exc))

    # -- the model and the recommendation -------------------------------------------------------------

    def server_model(self) -> ServerModel:
        serving = self.server_info.serving if self.server_info is not None else ServingConfig()
        constants: ByteConstants | None = None
        rest: float | None = None
        if self.target.state_bytes_per_slot and self.target.kv_bytes_per_token:
            constants = ByteConstants(self.target.state_bytes_per_slot, self.target.kv_bytes_per_token)
        elif self.boot is not None:
            constants, rest = self.boot.constants(), self.boot.rest_bytes
        elif self.server_info is not None:
            inverted = constants_from_server_info(self.server_info)
            if inverted is not None:
                constants, rest = inverted
        if self.target.rest_gib:
            rest = self.target.rest_gib * GIB
        observed_clamp = observed_cache = kv_tokens = None
        memory = MemoryFacts(mem_fraction_static=serving.mem_fraction_static)
        if self.server_info is not None and self.server_info.shards:
            shard = self.server_info.shards[0]
            observed_clamp, observed_cache, kv_tokens = (
                shard.effective_max_running_requests, shard.max_mamba_cache_size, shard.kv_capacity_tokens,
            )
        if self.boot is not None:
            observed_clamp = observed_clamp or self.boot.max_running_requests
            memory = MemoryFacts(
                card_available_gib=self.boot.avail_before_weights_gib,
                idle_after_pools_gib=self.boot.memory_pool_end_avail_gib,
                idle_after_graphs_gib=self.boot.available_gpu_mem_gib,
                mem_fraction_static=serving.mem_fraction_static,
            )
        context_len = 262144
        if self.previous is not None and self.previous.ranks and self.previous.ranks[0].context_len:
            context_len = int(self.previous.ranks[0].context_len)
        return ServerModel(
            serving=serving, constants=constants, rest_bytes=rest, observed_max_running_requests=observed_clamp,
            observed_max_mamba_cache_size=observed_cache, kv_capacity_tokens=kv_tokens,
            model_context_len=context_len, memory=memory,
        )

    def _status(self, now: float) -> TargetStatus:
        stale = self.consecutive_failures >= self.config.stale_after_cycles
        model = self.server_model()
        picture = WorkloadPicture(
            summary=self.estimator.summary(now),
            context_length=self.estimator.time_averaged_context(),
            confidence=self.estimator.confidence(now),
        )
        try:
            rec = recommend(model, picture, self.recommender_settings, inputs_stale=stale)
        except (ValueError, ZeroDivisionError) as exc:
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
        model_name = ""
        if self.server_info is not None and self.server_info.model_name:
            model_name = self.server_info.model_name
        elif self.previous is not None and self.previous.model_name:
            model_name = self.previous.model_name
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
        )

    def close(self) -> None:
        self.client.close()
