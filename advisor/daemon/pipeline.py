"""One server's cycle, however it is observed: read logs, take the metrics, refresh /server_info, estimate,
recommend (the VPA recommender's RunOnce, per server). The I/O is the server's `ObservationSource`
(advisor.daemon.targets: a direct scrape, or a store's share of one query set); the state kept across cycles
and checkpointed is `ServerState`. Every failure is counted in the server's one `ErrorLedger`; the last good
estimate stays and is marked stale. Nothing here raises out of `run`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from advisor.config import AdvisorConfig, TargetConfig
from advisor.daemon.replay_pool import runner as replay_runner
from advisor.errors import InputError
from advisor.estimate.deltas import CounterTracker, ObservationDelta
from advisor.estimate.steptime import StepTimeEstimator, attention_context_of
from advisor.estimate.traffic import TrafficEstimator, TrafficSettings
from advisor.estimate.workload import EstimatorSettings, WorkloadEstimator
from advisor.export.snapshot import HISTORY_POINTS, HistoryPoint, ServerView, history_point
from advisor.feeder import (
    ByteOverrides,
    ServerInfoConstants,
    chunked_prefill_size_of,
    decode_log_interval_of,
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
from advisor.sources.loglines import DecodeInterval, LogDigest, RequestRecord, StatsLine
from advisor.sources.metrics import MetricsObservation
from advisor.sources.server_info import ServerInfo
from advisor.status import TargetStatus

# Every source of error a server's ledger counts (each exported from the start, at 0).
SOURCES = ("metrics", "server_info", "logs", "boot_log", "checkpoint", "internal", "deadline")


class ErrorLedger:
    """The one place a server's errors are counted: totals per source (sglang_advisor_scrape_errors_total,
    checkpointed) and this cycle's one-line messages (`last_errors`)."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {source: 0 for source in SOURCES}
        self.messages: list[str] = []

    def count(self, source: str, message: str | None = None) -> None:
        self.totals[source] = self.totals.get(source, 0) + 1
        if message:
            self.messages.append(f"{source}: {message}")

    def begin_cycle(self) -> None:
        self.messages = []

    def restore(self, saved: object) -> None:
        for source, count in dict(saved if isinstance(saved, dict) else {}).items():
            if source in self.totals and isinstance(count, int):
                self.totals[source] = count


# A replay is redone before its interval is out when the effective context moved by this factor since it ran,
# and at least this share of the interval has passed.
REPLAY_SHIFT_FACTOR = 1.33
REPLAY_SHIFT_MIN_SHARE = 0.25
# ... and again after that share of the interval while a new regime is young: read from under this share of the
# window, or not yet read at all (the shift seen before the new traffic was long enough to read apart), for at most
# YOUNG_REGIME_FOLLOW_UPS replays that read none. Its sample grows by a minute or two between such replays, and where
# its plateau narrows is what the advice follows.
# Only where the requests are followed (a request log): a metrics-only picture is a fresh draw each replay, and a
# young regime's few minutes drawn again and again moved its advice more than they taught it (in a first trial, on
# the held-out TP2 regime rows, seeds 1-4, the minutes to a good ratio after the step back to chat went from 0.25 to
# 19.25-19.75 on two seeds, and one row's final score from 99.6% to 97.8%).
YOUNG_REGIME_WINDOW_SHARE = 0.5
YOUNG_REGIME_FOLLOW_UPS = 2
# A metrics-only replay is averaged with the last one's draw (`remembered_curve`) where the last one's window held at
# least this share of the current window: two draws of the same traffic. A server's first replays span its first
# minutes, which may be unlike the traffic since: on one GPU, agentic sessions' first 10 minutes peaked at r 1.03-1.18
# and the next 15 at 0.78-0.90, and their mean advised a raise the next replay dropped.
REMEMBERED_WINDOW_SHARE = 0.75


@dataclass
class LogReading:
    """What one cycle's new log lines gave (a source without logs gives an empty one)."""

    request_lengths: list[tuple[int, int]] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)  # the same requests with their times
    decode_intervals: list[DecodeInterval] = field(default_factory=list)
    prefill_batches: list[StatsLine] = field(default_factory=list)
    retractions: int = 0
    boot: BootInfo | None = None
    errors: list[str] = field(default_factory=list)  # counted under source=logs

    def add(self, found: LogDigest) -> None:
        """What one batch of a log's lines gave (the latest boot block wins)."""
        self.request_lengths.extend(found.request_lengths)
        self.requests.extend(found.requests)
        self.decode_intervals.extend(found.decode_intervals)
        self.prefill_batches.extend(found.prefill_batches)
        self.retractions += found.retracted_requests
        self.errors.extend(found.errors)
        if found.boot is not None:
            self.boot = found.boot


@dataclass
class InfoAnswer:
    """A /server_info answer: the info (possibly a stand-in), an error to count (even when a stand-in answered),
    and a note (code, text) the recommendation carries while this answer stands."""

    info: ServerInfo | None
    error: str | None = None
    note: tuple[str, str] | None = None


class ObservationSource(Protocol):
    """How one server is observed: the I/O half of its cycle."""

    def read_logs(self) -> LogReading: ...

    def fetch_metrics(self) -> tuple[MetricsObservation | None, str | None]: ...  # (None, None): none to give

    def fetch_server_info(self, latest: MetricsObservation | None) -> InfoAnswer: ...  # info None, no error: none

    def take_warnings(self) -> list[str]: ...  # what its reads noticed but read anyway (counted under metrics)

    def state(self) -> dict[str, Any]: ...  # what it keeps across restarts (log offsets)

    def restore(self, saved: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class ReplayBudget:
    """Seconds of what-if replay one cycle may spend across a store's servers (`replay_budget_seconds`): the
    fleet runs its servers oldest replay first, each due replay runs while some budget is left (so one may
    overrun it by its own length), and the servers past it keep their last curve until a later cycle."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds
        self.spent = 0.0
        self.ran = 0
        self.deferred = 0

    def allows(self) -> bool:
        return self.left > 0

    def spend(self, seconds: float, replayed: bool) -> None:
        """Charge a replay's seconds (its inputs' too, when they came to nothing to replay)."""
        self.left -= seconds
        self.spent += seconds
        self.ran += replayed


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
    step_seconds: dict[str, float] = field(default_factory=dict)  # logs, metrics, server_info, recommend, target


@dataclass
class ServerResult:
    """One server's cycle: its status, what the cycle saw, and what the exporter shows of it."""

    status: TargetStatus
    report: CycleReport
    view: ServerView


# What a checkpoint keeps of the last recommendation: what the next one's hysteresis and kept moves read.
KEPT_DECISION_FIELDS = ("decision", "reason_code", "ratio", "ratio_lower", "ratio_upper", "predicted_goodput_gain_ratio")
MOVE_OR_HOLD = ("hold", "raise_ratio", "lower_ratio")


def _number_or_none(value: object) -> float | None:
    """A checkpoint's number, or None; ValueError on anything else (a bool, a string, NaN or infinity)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


class ServerState:
    """What one server's cycles learn and the checkpoint keeps: the workload estimate, the traffic and step times
    the what-if replay replays, the error totals, whether request logs feed it, the last success."""

    def __init__(self, settings: EstimatorSettings, traffic: TrafficSettings) -> None:
        self.settings = settings
        self.estimator = WorkloadEstimator(settings)
        self.traffic = TrafficEstimator(traffic)
        self.step_time = StepTimeEstimator(settings.half_life_seconds)
        self.ledger = ErrorLedger()
        self.uses_request_logs = False
        self.last_success: float | None = None
        self.restored = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator.to_dict(),
            "traffic": self.traffic.to_dict(),
            "step_time": self.step_time.to_dict(),
            "uses_request_logs": self.uses_request_logs,
            "errors_total": dict(self.ledger.totals),
            "last_success": self.last_success,
        }

    def restore(self, saved: dict[str, Any], name: str) -> bool:
        """Take a checkpoint entry; False (counted, starting cold) when its estimator is unusable."""
        try:
            estimator = WorkloadEstimator.from_dict(saved["estimator"], self.settings)
        except (KeyError, TypeError, ValueError) as exc:
            self.ledger.count("checkpoint", f"checkpoint for {name} unusable ({exc}); starting cold")
            return False
        self.estimator = estimator
        try:
            if "traffic" in saved:
                self.traffic = TrafficEstimator.from_dict(saved["traffic"])
            if "step_time" in saved:
                self.step_time = StepTimeEstimator.from_dict(saved["step_time"])
        except (KeyError, TypeError, ValueError) as exc:
            self.ledger.count("checkpoint", f"checkpoint for {name}: replay inputs unusable ({exc}); relearning them")
        self.uses_request_logs = bool(saved.get("uses_request_logs", False))
        self.ledger.restore(saved.get("errors_total", {}))
        if isinstance(saved.get("last_success"), (int, float)):
            self.last_success = float(saved["last_success"])
        self.restored = True
        return True


class ServerPipeline:
    """One SGLang server's cycle over its observation source; the same for every way of observing it."""

    def __init__(self, target: TargetConfig, config: AdvisorConfig, source: ObservationSource) -> None:
        self.target = target
        self.config = config
        self.source = source
        self.server_state = ServerState(EstimatorSettings(half_life_seconds=config.half_life_seconds),
                                        TrafficSettings(window_seconds=config.replay_window_seconds))
        self.recommender_settings = RecommenderSettings(state_bias=config.state_bias)
        self.counters = CounterTracker()  # honest deltas across restarts and a URL flipping between servers
        self.previous: MetricsObservation | None = None
        self.server_info: ServerInfo | None = None
        self.info_note: tuple[str, str] | None = None
        self.boot: BootInfo | None = None
        self.cycles = 0
        self.consecutive_failures = 0
        self.last_recommendation: Recommendation | None = None
        self.history: deque[HistoryPoint] = deque(maxlen=HISTORY_POINTS)  # what `/` draws of past cycles
        self.info_due = True
        self.uses_decode_lines = False
        self.replay_result: ReplayCurve | None = None
        self.replay_time: float | None = None
        self.replay_live_ratio: float | None = None  # the live ratio the last replay compared against
        self.replay_context: float | None = None  # the effective context L the last replay saw
        # how many more replays come sooner, for a young regime (`_follow_ups`)
        self.replay_follow_ups = 0
        self.last_scrape_now: float | None = None  # when the previous good scrape was taken (advisor clock)
        self._serving_error = ""
        self._info_constants = ServerInfoConstants()  # the byte constants inverted from the current /server_info
        if target.boot_log:
            try:
                self.boot = read_boot_log(target.boot_log)
            except InputError as exc:
                self.ledger.count("boot_log", str(exc))

    @property
    def name(self) -> str:
        return self.target.name

    # The parts of the state every caller reads.
    @property
    def ledger(self) -> ErrorLedger:
        return self.server_state.ledger

    @property
    def errors_total(self) -> dict[str, int]:
        return self.server_state.ledger.totals

    @property
    def estimator(self) -> WorkloadEstimator:
        return self.server_state.estimator

    # -- checkpoint -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        state = {**self.server_state.to_dict(), "followers": self.source.state()}
        if self.replay_result is not None and self.replay_time is not None:
            # A restart reuses the curve until its replay is due (or a cycle's budget reaches it), rather than
            # answering from the closed form meanwhile: the advice does not flip because the daemon restarted.
            state["replay"] = {"curve": self.replay_result.to_dict(), "time": self.replay_time,
                               "live_ratio": self.replay_live_ratio, "context": self.replay_context,
                               "follow_ups": self.replay_follow_ups}
        previous = self.last_recommendation
        if previous is not None and previous.ratio is not None and previous.decision in MOVE_OR_HOLD:
            # ... and the last decision keeps its hysteresis: a move advised before the restart stands as it would have
            state["last_decision"] = {name: getattr(previous, name) for name in KEPT_DECISION_FIELDS}
        return state

    def restore(self, saved: dict[str, Any]) -> None:
        if not self.server_state.restore(saved, self.name):
            return
        followers = saved.get("followers", {})
        self.source.restore(followers if isinstance(followers, dict) else {})
        try:
            self._restore_decision(saved)
        except (KeyError, TypeError, ValueError) as exc:
            self.replay_result = self.replay_time = self.last_recommendation = None
            self.ledger.count("checkpoint", f"checkpoint for {self.name}: last curve unusable ({exc}); replaying afresh")

    def _restore_decision(self, saved: dict[str, Any]) -> None:
        replay = saved.get("replay")
        if isinstance(replay, dict):
            curve, when = ReplayCurve.from_dict(replay["curve"]), _number_or_none(replay["time"])
            if when is None:
                raise ValueError("the replay has no time")
            self.replay_result, self.replay_time = curve, when
            self.replay_live_ratio = _number_or_none(replay.get("live_ratio"))
            self.replay_context = _number_or_none(replay.get("context"))
            follow_ups = replay.get("follow_ups")
            self.replay_follow_ups = follow_ups if isinstance(follow_ups, int) and follow_ups >= 0 else 0
        decision = saved.get("last_decision")
        if isinstance(decision, dict):
            kind, code, ratio = decision.get("decision"), decision.get("reason_code"), decision.get("ratio")
            if kind not in MOVE_OR_HOLD or not isinstance(code, str) or _number_or_none(ratio) is None:
                raise ValueError(f"last decision {kind!r} at r {ratio!r} is not one")
            self.last_recommendation = Recommendation(
                decision=str(kind), reason="restored from the checkpoint", reason_code=code,
                ratio=_number_or_none(ratio), ratio_lower=_number_or_none(decision.get("ratio_lower")),
                ratio_upper=_number_or_none(decision.get("ratio_upper")),
                predicted_goodput_gain_ratio=_number_or_none(decision.get("predicted_goodput_gain_ratio")),
            )

    # -- the cycle ------------------------------------------------------------------------------------

    def run(self, now: float, replay_budget: ReplayBudget | None = None) -> ServerResult:
        """One cycle; a bug in it is counted (source=internal) and shown as down, never raised."""
        started = time.monotonic()
        try:
            status, report, model = self._cycle(now, replay_budget)
        except Exception as exc:
            self.ledger.count("internal", f"cycle failed: {type(exc).__name__}: {exc}")
            status = TargetStatus(server=self.name, up=False, last_errors=list(self.ledger.messages),
                                  scrape_errors_total=dict(self.ledger.totals))
            report, model = CycleReport(errors=list(self.ledger.messages)), None
        seconds = time.monotonic() - started
        status.last_cycle_duration_seconds = seconds
        report.step_seconds["target"] = seconds
        self.history.append(history_point(status.recommendation, now))
        try:
            weights: tuple[float, ...] | None = tuple(self.estimator.request_context.weights.tolist())
        except Exception:  # page data is optional: never let it cost the cycle
            weights = None
        view = ServerView(status=status, model=model, context_weights=weights, history=tuple(self.history))
        return ServerResult(status=status, report=report, view=view)

    def _cycle(self, now: float, replay_budget: ReplayBudget | None = None) -> tuple[TargetStatus, CycleReport, ServerModel]:
        started = time.monotonic()
        self.cycles += 1
        self.ledger.begin_cycle()
        report = CycleReport()
        self._read_logs(now, report)
        step = time.monotonic()
        report.step_seconds["logs"] = step - started
        scraped = self._take_metrics(now, report)
        report.step_seconds["metrics"] = time.monotonic() - step
        if scraped:
            self.consecutive_failures = 0
            self.server_state.last_success = now
        else:
            self.consecutive_failures += 1
        if self.info_due or self.cycles % max(1, self.config.server_info_every) == 0:
            step = time.monotonic()
            self._refresh_server_info()
            report.step_seconds["server_info"] = time.monotonic() - step
        report.server_info = self.server_info
        report.boot = self.boot
        report.errors = list(self.ledger.messages)
        step = time.monotonic()
        status, model = self._status(now, replay_budget)
        report.step_seconds["recommend"] = time.monotonic() - step
        return status, report, model

    def server_info_due_next(self) -> bool:
        """Whether the next cycle (or replayed sample) asks /server_info."""
        return self.info_due or (self.cycles + 1) % max(1, self.config.server_info_every) == 0

    def feed_history(self, now: float) -> None:
        """Take one historical sample from the source (a store's replay): the metrics, and /server_info when
        none is known yet; no logs, no recommendation, no errors shown."""
        if self.server_info is None and self.info_due:
            self._refresh_server_info()
        self._take_metrics(now, CycleReport())
        self.server_state.last_success = now
        self.ledger.begin_cycle()

    def decode_log_interval(self) -> int:
        """The server's --decode-log-interval (`decode_log_interval_of`): the prefills a decode line's interval
        held are spread over its steps (read as the default 40, an operator who raised it to quiet the log would
        have them read as that many times dearer a step)."""
        return decode_log_interval_of(self.server_info, self.boot)

    def _read_logs(self, now: float, report: CycleReport) -> None:
        reading = self.source.read_logs()
        for error in reading.errors:
            self.ledger.count("logs", error)
        report.log_retractions += reading.retractions
        self.server_state.traffic.observe_requests(exact_requests(reading.requests, self.config.time_scale))
        if reading.boot is not None:
            self.boot = reading.boot
            self.info_due = True
        if reading.decode_intervals:
            self.uses_decode_lines = True
            self.server_state.step_time.observe(
                now, step_samples_from_log(reading.decode_intervals, steps=self.decode_log_interval()))
        if reading.prefill_batches:
            self.server_state.traffic.observe_admissions(
                [[line.new_seqs, line.new_tokens, line.cached_tokens or 0, -1 if line.dp_rank is None else line.dp_rank,
                  line.queued_requests, -1 if line.pending_tokens is None else line.pending_tokens]
                 for line in reading.prefill_batches
                 if line.new_seqs is not None and line.new_tokens is not None],
                chunk_tokens=chunked_prefill_size_of(self.server_info, self.boot),
                page_size=self.boot.page_size if self.boot is not None else 1,
            )
        if reading.request_lengths:
            self.server_state.uses_request_logs = True
            report.request_records = self.estimator.observe_requests(now, reading.request_lengths)

    def _take_metrics(self, now: float, report: CycleReport) -> bool:
        observation, error = self.source.fetch_metrics()
        for warning in self.source.take_warnings():  # read, but not as declared (an unusable charset): counted
            self.ledger.count("metrics", warning)
        if observation is None:
            if error is not None:  # (None, None): the source has no metrics to give, which is no failure
                self.ledger.count("metrics", error)
            return False
        interval = now - self.last_scrape_now if self.last_scrape_now is not None else None
        self.last_scrape_now = now
        delta = self.counters.diff(observation, now=now, interval_seconds=interval)
        report.metrics, report.delta = observation, delta
        first, before = self.previous is None, self.previous
        self.previous = observation
        if delta.restarted:
            self.info_due = True
        clamp = observed_clamp(self.server_info, self.boot, len(observation.ranks))
        sample = scrape_sample(observation, delta, clamp=clamp, log_retractions=report.log_retractions, baseline=first)
        # The first scrape after a checkpoint restore is only a baseline: its lifetime totals were seen before, and
        # the requests in flight are counted from it (not from the checkpoint's count, however old).
        if first and self.server_state.restored:
            observe_traffic_interval(self.server_state.traffic, now, delta, sample, baseline_only=True)
            return True
        if not self.server_state.uses_request_logs:
            self.estimator.observe_token_histograms(now, delta.prompt_tokens_histogram, delta.generation_tokens_histogram)
        self.estimator.observe_scrape(now, sample)
        observe_traffic_interval(self.server_state.traffic, now, delta, sample)
        if not self.uses_decode_lines:
            self.server_state.step_time.observe(now, step_samples_from_metrics(observation, delta, before))
        return True

    def _refresh_server_info(self) -> None:
        answer = self.source.fetch_server_info(self.previous)
        if answer.error:
            self.ledger.count("server_info", answer.error)
        if answer.info is None:
            return
        self.server_info = answer.info
        self.info_note = answer.note
        self.info_due = False

    # -- the model and the recommendation -------------------------------------------------------------

    def server_model(self) -> ServerModel:
        try:
            serving = serving_config_of(self.server_info, self.boot)
        except InputError as exc:
            if str(exc) != self._serving_error:  # count a bad boot-log server_args once, not every cycle
                self.ledger.count("boot_log", str(exc))
            self._serving_error = str(exc)
            serving = ServingConfig()
        if self.target.skip_decode_lock is not None:
            serving = serving.with_skip_decode_lock(self.target.skip_decode_lock)
        overrides = ByteOverrides(self.target.state_bytes_per_slot, self.target.kv_bytes_per_token, self.target.rest_gib)
        return server_model(serving, self.server_info, self.boot, self.previous, overrides, self._info_constants)

    def _status(self, now: float, replay_budget: ReplayBudget | None = None) -> tuple[TargetStatus, ServerModel]:
        stale = self.consecutive_failures >= self.config.stale_after_cycles
        model = self.server_model()
        picture = WorkloadPicture(
            summary=self.estimator.summary(now),
            context_length=self.estimator.time_averaged_context(),
            confidence=self.estimator.confidence(now),
        )
        picture.replay = self._replay(now, model, picture, replay_budget)
        try:
            rec = recommend(model, picture, self.recommender_settings, inputs_stale=stale,
                            previous=self.last_recommendation)
        except (ValueError, ZeroDivisionError) as exc:
            self.ledger.count("internal", f"recommendation failed: {exc}")
            rec = Recommendation(decision="insufficient_data", reason=f"cannot compute: {exc}")
        if self.info_note is not None:
            rec.add_note(*self.info_note)
        self.last_recommendation = rec
        serving = model.serving
        info = {
            "version": (self.server_info.version if self.server_info else None) or "unknown",
            "strategy": serving.strategy,
            "ssm_dtype": serving.mamba_ssm_dtype or "default",
            "kv_dtype": serving.kv_cache_dtype or "auto",
            "tp": str(serving.tp_size), "dp": str(serving.dp_size), "pp": str(serving.pp_size), "dcp": str(serving.dcp_size),
        }
        status = TargetStatus(
            server=self.name,
            model_name=model_name_of(self.server_info, self.previous),
            up=self.consecutive_failures == 0 and self.server_state.last_success is not None,
            stale=stale,
            last_success_timestamp=self.server_state.last_success,
            info=info,
            workload=picture.summary,
            recommendation=rec,
            scrape_errors_total=dict(self.ledger.totals),
            last_errors=list(self.ledger.messages),
            restarts_total=self.counters.restarts_total,
            last_restart_timestamp=self.counters.last_restart_timestamp,
            last_restart_reason=self.counters.last_restart_reason,
        )
        return status, model

    def _replay(self, now: float, model: ServerModel, picture: WorkloadPicture,
                budget: ReplayBudget | None = None) -> ReplayCurve | None:
        """The what-if replay's curve: recomputed every replay_interval_seconds, reused in between (and past
        the cycle's replay budget, when the caller sets one)."""
        interval = self.config.replay_interval_seconds
        if interval <= 0:
            return None
        live = live_ratio_of(model)
        # Reused between intervals, unless the server restarted with another split (its gain was against the old one).
        same_live = live is not None and self.replay_live_ratio is not None and math.isclose(live, self.replay_live_ratio)
        # ... and sooner when the traffic changed character since (a regime shift: the effective context L moved
        # by a third), once a quarter of the interval has passed
        context = picture.summary.effective_context_length
        soon = self.replay_time is not None and now - self.replay_time >= interval * REPLAY_SHIFT_MIN_SHARE
        moved = (context is not None and context > 0 and self.replay_context is not None and self.replay_context > 0
                 and max(context / self.replay_context, self.replay_context / context) > REPLAY_SHIFT_FACTOR)
        shifted = soon and moved
        if (self.replay_time is not None and now - self.replay_time < interval and self.replay_result is not None
                and same_live and not shifted and not (soon and self.replay_follow_ups > 0)):
            return self.replay_result
        if budget is not None and not budget.allows():  # before the inputs too: building them costs as well
            budget.deferred += 1
            if self.replay_result is None and not self._warming_up(picture):
                picture.replay_deferred = True
            return self.replay_result
        started = time.monotonic()
        replayed = False
        try:
            prior = prior_ratio(model, picture, self.recommender_settings)
            if prior is None:
                return self.replay_result
            if self.replay_result is None and self._warming_up(picture):
                return None
            step_time = self.server_state.step_time
            traffic = self.server_state.traffic.picture(seed=self.cycles)
            if traffic is None:
                return self.replay_result
            fit = step_time.fit(model.serving.draft_tokens if spec_enabled(model.serving) else 0,
                                attention_context=attention_context_of(
                                    (r.input_tokens, r.prefix_tokens if r.prefix_group else 0)
                                    for r in traffic.requests))
            # ... and for as many requests as a recommendation needs (a curve of fewer moves by more than its noise
            # from one replay to the next), unless the window is full: a slow server's window may never hold them.
            wanted = self.recommender_settings.min_requests
            if (self.replay_result is None and len(traffic.requests) < wanted
                    and picture.summary.history_seconds < self.config.replay_window_seconds):
                picture.replay_waiting_requests = (len(traffic.requests), int(wanted))
                return None
            server = scheduler_server(model, self.boot, fit.cost if fit else step_time.prior, self.server_info)
            if server is None:
                return self.replay_result
            # The last replay's draw is averaged in while it is of the same traffic on the same split: not after a
            # restart with another split, a regime shift's re-replay or a gap of two intervals, nor where its window
            # held under REMEMBERED_WINDOW_SHARE of this one.
            last = self.replay_result
            remembered = (last if last is not None and same_live and not shifted and self.replay_time is not None
                          and now - self.replay_time <= 2 * interval
                          and _shared_window(last.window_seconds, now - self.replay_time,
                                             traffic.window_seconds) >= REMEMBERED_WINDOW_SHARE else None)
            try:
                self.replay_result = replay_curve(server, traffic, prior_ratio=prior, live_ratio=live,
                                                  run_many=replay_runner(self.config.replay_workers),
                                                  previous=remembered)
            except (ValueError, ZeroDivisionError) as exc:
                self.ledger.count("internal", f"replay failed: {exc}")
                return self.replay_result
            replayed = True
        finally:
            if budget is not None:
                budget.spend(time.monotonic() - started, replayed)
        if replayed:
            self.replay_follow_ups = _follow_ups(self.replay_result, shifted, self.replay_follow_ups,
                                                 self.config.replay_window_seconds)
        self.replay_time, self.replay_live_ratio, self.replay_context = now, live, context
        return self.replay_result

    def _warming_up(self, picture: WorkloadPicture) -> bool:
        """Whether the first replay still waits for enough observed traffic (and says so on `picture`): a short
        history is too thin a draw of it, a few bursts decide its curve. Observed time, not the picture's span:
        under a long queue the completely known arrivals cover only part of it."""
        needed, seen = self.config.replay_min_window_seconds, picture.summary.history_seconds
        if seen < needed:
            picture.replay_warming_up = (seen, needed)
            return True
        return False

    def close(self) -> None:
        self.source.close()


def _follow_ups(curve: ReplayCurve | None, shifted: bool, left: int, window_seconds: float) -> int:
    """How many replays after the one just run come sooner: YOUNG_REGIME_FOLLOW_UPS where it, of followed requests,
    read a regime from under YOUNG_REGIME_WINDOW_SHARE of the window, or the effective context's shift brought it on;
    one fewer than `left` where it read none (the new traffic still too short to read apart from the old, and a shift
    no regime follows is not replayed on and on); none where it read an older regime."""
    if curve is None or curve.source == "metrics":
        return 0
    if curve.regime_seconds is not None:
        return YOUNG_REGIME_FOLLOW_UPS if curve.regime_seconds < YOUNG_REGIME_WINDOW_SHARE * window_seconds else 0
    return YOUNG_REGIME_FOLLOW_UPS if shifted else max(0, left - 1)


def _shared_window(previous_seconds: float, previous_age: float, window_seconds: float) -> float:
    """The share of a window (ending now) that a window `previous_age` seconds older and `previous_seconds` long held."""
    if not window_seconds > 0:
        return 0.0
    return max(0.0, min(previous_seconds, window_seconds - previous_age)) / window_seconds
