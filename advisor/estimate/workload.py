"""The running, recency-weighted picture of one server's workload (pure; `now` is always passed in).

Context length: every finished request's final context (input + output) enters two decaying histograms, one
weighted per request (what operators quote) and one weighted by residence (output tokens ~ decode steps held),
which is the distribution the KV pool sees: a request holds KV for as long as it decodes, so long and
heavy-tailed requests weigh more than their share. Per-request lengths come from request logs when present,
else are reconstructed from SGLang's marginal prompt/generation histograms and exact sums (independence assumed).
The live context of the running set (`decode_sum_seq_lens / num_running_reqs`) is kept beside it as a check.

Spikiness: finished requests are grouped into windows (>= `window_min_requests` and >= `window_min_seconds`);
each window's residence-weighted L enters time-weighted decayed moments of ln L. spikiness = their standard
deviation (0 for steady traffic, ~0.7 for two regimes a factor 4 apart). The time-weighted mean of the window
L is the time-averaged L the recommender turns into r; the spikiness sets its bias toward the state pool.

Half-life: 1 hour by default. LLM traffic shifts within hours, not days (VPA's 24 h is for container sizing);
one hour keeps a regime shift from lingering past an afternoon while smoothing minute-scale bursts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from advisor.estimate.histogram import DecayingHistogram, DecayingMoments, bucket_indices
from advisor.estimate.summary import WorkloadSummary
from advisor.sources.metrics import Histogram

CHECKPOINT_VERSION = 1
# KV usage above which a queue waiting below the clamp counts as KV-blocked admission.
KV_PRESSURE_USAGE = 0.75


@dataclass(frozen=True)
class EstimatorSettings:
    half_life_seconds: float = 3600.0
    # Confidence reaches 1 after this much history and this many requests (VPA: 24 h / 1440 samples).
    confidence_history_seconds: float = 1800.0
    confidence_requests: float = 2000.0
    window_min_requests: int = 48
    window_min_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("half_life_seconds", "confidence_history_seconds", "confidence_requests", "window_min_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.window_min_requests < 1:
            raise ValueError(f"window_min_requests must be >= 1, got {self.window_min_requests}")


@dataclass
class ScrapeSample:
    """What one scrape of one server says about its live state (sums over DP ranks)."""

    running_requests: float
    queued_requests: float
    max_running_requests: float | None  # the clamp (sum over DP workers)
    decode_sum_seq_lens: float | None = None
    kv_used_tokens: float | None = None
    kv_capacity_tokens: float | None = None
    state_slots_used: float | None = None
    state_pool_slots: float | None = None
    retracted_requests: float = 0.0  # delta since the previous scrape
    retracted_tokens: float = 0.0  # delta (input + output tokens of the retracted)


def _bucket_representatives(upper_bounds: Sequence[float]) -> np.ndarray:
    """A representative length per bucket (geometric middle; the +Inf bucket gets 1.5x its start); read-only,
    computed once per bucket layout (a server's layout never changes, and a fleet's history asks it per sample)."""
    return _representatives_of(tuple(upper_bounds))


@functools.lru_cache(maxsize=64)
def _representatives_of(upper_bounds: tuple[float, ...]) -> np.ndarray:
    reps = []
    lower = 0.0
    for bound in upper_bounds:
        if math.isinf(bound):
            reps.append(max(lower, 1.0) * 1.5)
        else:
            reps.append(math.sqrt(max(lower, 1.0) * bound) if lower > 0 else bound / 2)
        lower = bound
    array = np.asarray(reps, dtype=float)
    array.setflags(write=False)
    return array


def pairs_from_marginals(
    prompt_bounds: Sequence[float],
    prompt_counts: Sequence[float],
    generation_bounds: Sequence[float],
    generation_counts: Sequence[float],
    prompt_sum: float | None = None,
    generation_sum: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input, output, request weight) pairs from per-bucket counts of the two marginal histograms.

    Pairs every prompt bucket with every generation bucket (independence); representatives are scaled so the
    sums match SGLang's exact `_sum` (or token totals) when given.
    """
    p_counts = np.asarray(prompt_counts, dtype=float)
    g_counts = np.asarray(generation_counts, dtype=float)
    n_p, n_g = p_counts.sum(), g_counts.sum()
    if n_p <= 0 or n_g <= 0:
        return np.empty(0), np.empty(0), np.empty(0)
    p_reps = _bucket_representatives(prompt_bounds)
    g_reps = _bucket_representatives(generation_bounds)
    if prompt_sum and prompt_sum > 0:
        p_reps = p_reps * (prompt_sum / float(np.dot(p_reps, p_counts)))
    if generation_sum and generation_sum > 0:
        g_reps = g_reps * (generation_sum / float(np.dot(g_reps, g_counts)))
    p_nz, g_nz = np.nonzero(p_counts > 0)[0], np.nonzero(g_counts > 0)[0]
    inputs = np.repeat(p_reps[p_nz], len(g_nz))
    outputs = np.broadcast_to(g_reps[g_nz], (len(p_nz), len(g_nz))).ravel()  # np.tile's, without its overhead
    weights = (p_counts[p_nz][:, np.newaxis] * g_counts[g_nz]).ravel() / n_g  # np.outer's
    return inputs, outputs, weights


class WorkloadEstimator:
    def __init__(self, settings: EstimatorSettings | None = None) -> None:
        self.settings = settings or EstimatorSettings()
        half_life = self.settings.half_life_seconds
        self.request_context = DecayingHistogram(half_life)  # weight: one per request
        self.resident_context = DecayingHistogram(half_life)  # weight: residence (output tokens)
        self.live_context = DecayingHistogram(half_life)  # weight: seconds observed
        self.window_log_context = DecayingMoments(half_life)  # x = ln(window L), weight: window seconds
        self.window_context = DecayingMoments(half_life)  # x = window L, weight: window seconds
        self.saturated = DecayingMoments(half_life)
        self.kv_blocked = DecayingMoments(half_life)
        self.retractions = DecayingMoments(half_life)  # x = retractions per second in the interval
        self.retracted_tokens = DecayingMoments(half_life)
        self.requests_total = 0.0
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.last_scrape_time: float | None = None
        # the open spikiness window
        self.window_start: float | None = None
        self.window_requests = 0.0
        self.window_context_residence = 0.0  # sum of (in + out) * out
        self.window_residence = 0.0  # sum of out

    # -- inputs ---------------------------------------------------------------------------------------

    def _touch(self, now: float) -> None:
        if self.first_time is None:
            self.first_time = now
        self.last_time = now if self.last_time is None else max(self.last_time, now)
        if self.window_start is None:
            self.window_start = now

    def observe_requests(self, now: float, lengths: Iterable[tuple[float, float]]) -> int:
        """Finished requests as (input tokens, output tokens); exact lengths from request logs."""
        rows = np.asarray([(float(i), float(o)) for i, o in lengths if i >= 0 and o >= 0], dtype=float)
        if rows.size == 0:
            return 0
        self._add(now, rows[:, 0], rows[:, 1], np.ones(len(rows)))
        return len(rows)

    def observe_marginals(
        self,
        now: float,
        prompt_bounds: Sequence[float],
        prompt_counts: Sequence[float],
        generation_bounds: Sequence[float],
        generation_counts: Sequence[float],
        prompt_sum: float | None = None,
        generation_sum: float | None = None,
    ) -> float:
        """Per-interval bucket counts of SGLang's two token histograms (no request logs available)."""
        inputs, outputs, weights = pairs_from_marginals(
            prompt_bounds, prompt_counts, generation_bounds, generation_counts, prompt_sum, generation_sum
        )
        if weights.size == 0:
            return 0.0
        self._add(now, inputs, outputs, weights)
        return float(weights.sum())

    def observe_token_histograms(
        self, now: float, prompt: Histogram | None, generation: Histogram | None,
        prompt_sum: float | None = None, generation_sum: float | None = None,
    ) -> float:
        """SGLang's prompt/generation token histograms (lifetime or per-interval deltas); sums default to theirs."""
        if prompt is None or generation is None or prompt.count <= 0:
            return 0.0
        return self.observe_marginals(
            now, prompt.upper_bounds, prompt.bucket_counts(), generation.upper_bounds, generation.bucket_counts(),
            prompt.sum if prompt_sum is None else prompt_sum, generation.sum if generation_sum is None else generation_sum,
        )

    def _add(self, now: float, inputs: np.ndarray, outputs: np.ndarray, weights: np.ndarray) -> None:
        self._touch(now)
        context = inputs + outputs
        residence = np.maximum(outputs, 1.0) * weights
        count = float(weights.sum())
        buckets = bucket_indices(context)  # both histograms take the same lengths
        self.request_context.add_many(context, weights, now, samples=count, buckets=buckets)
        self.resident_context.add_many(context, residence, now, samples=count, buckets=buckets)
        self.requests_total += count
        self.window_requests += count
        self.window_context_residence += float(np.dot(context, residence))
        self.window_residence += float(residence.sum())
        self._maybe_close_window(now)

    def _maybe_close_window(self, now: float) -> None:
        assert self.window_start is not None
        duration = now - self.window_start
        if self.window_requests < self.settings.window_min_requests or duration < self.settings.window_min_seconds:
            return
        if self.window_residence > 0:
            window_context = self.window_context_residence / self.window_residence
            if window_context > 0:
                self.window_log_context.add(math.log(window_context), duration, now)
                self.window_context.add(window_context, duration, now)
        self.window_start = now
        self.window_requests = self.window_context_residence = self.window_residence = 0.0

    def observe_scrape(self, now: float, sample: ScrapeSample) -> None:
        """One scrape's live state; the interval since the previous scrape weights it."""
        self._touch(now)
        if self.last_scrape_time is None or now <= self.last_scrape_time:
            self.last_scrape_time = now
            return
        interval = now - self.last_scrape_time
        self.last_scrape_time = now
        running, queued = sample.running_requests, sample.queued_requests
        clamp = sample.max_running_requests
        at_clamp = clamp is not None and clamp > 0 and running >= clamp
        self.saturated.add(1.0 if (at_clamp and queued > 0) else 0.0, interval, now)
        kv_usage = (
            sample.kv_used_tokens / sample.kv_capacity_tokens
            if sample.kv_used_tokens is not None and sample.kv_capacity_tokens
            else None
        )
        # KV-blocked admission: a queue waits below the clamp while the KV pool is under pressure (the
        # admission reservation is not observable, so usage stands in for it; without usage, any such wait).
        kv_pressed = kv_usage is None or kv_usage >= KV_PRESSURE_USAGE
        self.kv_blocked.add(1.0 if (queued > 0 and not at_clamp and kv_pressed) else 0.0, interval, now)
        self.retractions.add(sample.retracted_requests / interval, interval, now)
        self.retracted_tokens.add(sample.retracted_tokens / interval, interval, now)
        if sample.decode_sum_seq_lens is not None and running > 0:
            self.live_context.add(sample.decode_sum_seq_lens / running, interval, now)

    # -- outputs --------------------------------------------------------------------------------------

    def confidence(self, now: float) -> float:
        """VPA's rule: the smaller of history span and sample count, each against its own yardstick."""
        if self.first_time is None:
            return 0.0
        span = max(0.0, now - self.first_time) / self.settings.confidence_history_seconds
        count = self.requests_total / self.settings.confidence_requests
        return min(span, count)

    def effective_context_length(self) -> float | None:
        """The L the KV pool sees: the residence-weighted mean final context of finished requests."""
        return self.resident_context.mean()

    def time_averaged_context(self) -> float | None:
        """Time-weighted mean over windows of the window's L_eff, falling back to the pooled estimate."""
        value = self.window_context.mean()
        return self.effective_context_length() if value is None else value

    def spikiness(self) -> float:
        value = self.window_log_context.std()
        return 0.0 if value is None else value

    def summary(self, now: float) -> WorkloadSummary:
        history = 0.0 if self.first_time is None else max(0.0, now - self.first_time)
        p50, p90, p99 = self.request_context.percentiles((0.5, 0.9, 0.99))
        return WorkloadSummary(
            context_length_mean=self.request_context.mean(),
            context_length_p50=p50,
            context_length_p90=p90,
            context_length_p99=p99,
            live_context_mean=self.live_context.mean(),
            effective_context_length=self.effective_context_length(),
            spikiness=self.spikiness(),
            retractions_per_second=self.retractions.mean(),
            retracted_tokens_per_second=self.retracted_tokens.mean(),
            state_pool_saturation_ratio=self.saturated.mean(),
            kv_blocked_ratio=self.kv_blocked.mean(),
            requests_observed=self.requests_total,
            history_seconds=history,
        )

    # -- checkpoint -----------------------------------------------------------------------------------

    _HISTOGRAMS = ("request_context", "resident_context", "live_context")
    _MOMENTS = ("window_log_context", "window_context", "saturated", "kv_blocked", "retractions", "retracted_tokens")
    _SCALARS = ("requests_total", "first_time", "last_time", "last_scrape_time", "window_start", "window_requests",
                "window_context_residence", "window_residence")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": CHECKPOINT_VERSION, "settings": asdict(self.settings)}
        for name in self._HISTOGRAMS:
            out[name] = getattr(self, name).to_dict()
        for name in self._MOMENTS:
            out[name] = getattr(self, name).to_dict()
        for name in self._SCALARS:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], settings: EstimatorSettings | None = None) -> WorkloadEstimator:
        """Restore; raises ValueError (or KeyError/TypeError) on a checkpoint that is not ours."""
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {data.get('version')!r} is not {CHECKPOINT_VERSION}")
        estimator = cls(settings or EstimatorSettings(**data["settings"]))
        for name in cls._HISTOGRAMS:
            setattr(estimator, name, DecayingHistogram.from_dict(data[name]))
        for name in cls._MOMENTS:
            setattr(estimator, name, DecayingMoments.from_dict(data[name]))
        for name in cls._SCALARS:
            value = data[name]
            if value is not None and not isinstance(value, (int, float)):
                raise ValueError(f"checkpoint field {name} is not a number")
            setattr(estimator, name, value)
        return estimator
