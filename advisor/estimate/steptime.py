"""The server's own step-time model, fitted from what it shows (pure; `now` is passed in): decode-batch lines
(`#running-req`, `#full token`, `gen throughput`, with the prefill lines printed between two of them) or, without
logs, the `num_running_reqs` / `token_usage` / `gen_throughput` gauges. The fit gives the scheduler model's cost
coefficients, so a replay steps as fast as this server does (a TP8 node and one GPU holding a whole MoE differ
several-fold).

SGLang prints `gen throughput` = tokens decoded since the previous decode line / wall time since it
(`managers/scheduler_components/metrics_reporter.py`, once every `decode_log_interval` decode steps), so the
time per decode step it implies, batch / gen_throughput, also holds the prefill batches run between the two
lines; those enter as features of their own. The fit is a ridge regression on decayed normal equations, pulled
toward the default cost model scaled to the data, so thin or collinear data (a steady batch size) still gives
the right overall speed and spread data separates the per-request and per-KV-token terms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from advisor.scheduler.costmodel import CostModel

CHECKPOINT_VERSION = 1
# Features of one sample, per decode step: 1, batch, KV tokens, prefill batches and prefill tokens per step.
FEATURES = ("decode_base_seconds", "decode_per_request_seconds", "decode_per_kv_token_seconds",
            "prefill_base_seconds", "prefill_per_token_seconds")
# The features before the prefill ones (decode base, per request, per KV token).
PREFILL_FEATURES = 3
# The pull toward the scaled default, relative to each coefficient's own weight in the data (its diagonal of the
# normal matrix): a feature whose default cost is small against the others (the per-KV-token term beside the
# per-step base) is held back no more than one whose default is large.
RIDGE = 0.002
# ... plus this share of the mean diagonal, so a feature the samples never show stays at the scaled default.
RIDGE_FLOOR = 0.001
# A fitted coefficient stays within this factor of the scaled default.
COEFFICIENT_RANGE = 10.0
# A gauge sample's step time is its last decode_log_interval steps' (SGLang sets `gen_throughput` at each decode
# line), while its prefill features are the scrape interval's mean: a window that caught a burst's long prefills
# reads several times slower than the interval says, and one such sample among the dozen a window holds doubled
# the fitted speed (long documents, 27K-token prompts: the replay then queued where the server never did). Past
# OUTLIER_MIN_SAMPLES estimated samples, one reads at most OUTLIER_FACTOR times their typical ratio to the default
# (the decayed geometric mean); the decode-line samples read their prefills and are taken as they are. Four
# leaves a window of a few long prefills as it is: at three, the 3.4% of one GPU's diurnal samples past it (its
# prefill 5x the default's, its decode 3x) lost 3.6% of its step time, and that row's one-point optimum with it.
OUTLIER_FACTOR = 4.0
OUTLIER_MIN_SAMPLES = 3.0
# Below this many gauge samples (decayed weight) the decode costs are not split either: three coefficients fitted
# to a dozen lumpy samples followed their noise (the same long-document server came out with its per-step base at
# 0.2x or 4x the default's, its per-request cost at 0.1x or 20x, from one watch to the next), and the replay
# then stepped 2-3x slower than the server at its batch. The default's shape at the overall speed stands until
# then: 7.5 minutes of 15 s scrapes.
ESTIMATED_SPLIT_SAMPLES = 30.0


@dataclass(frozen=True)
class StepSample:
    """One decode-line interval on one DP rank: the batch and KV it decoded, the throughput SGLang printed, the
    decode steps in the interval, and the prefill batches and tokens run between this line and the previous."""

    batch: float
    kv_tokens: float
    gen_throughput: float  # tokens/s as printed
    steps: float  # decode steps since the previous line (decode_log_interval)
    prefill_batches: float = 0.0
    prefill_tokens: float = 0.0
    accept_length: float = 1.0  # speculative decoding: tokens accepted per request per verify step
    # Whether the prefill features were read (the prefill lines between two decode lines) or estimated from the
    # scrape interval's counters, whose per-interval noise would hide the prefill costs in the decode ones.
    prefill_read: bool = True


@dataclass(frozen=True)
class StepTimeFit:
    """The fitted cost model and how much it rests on: samples behind it, and its speed against the default."""

    cost: CostModel
    samples: float
    speed_factor: float  # fitted seconds per step over the default's, at the observed batches (>1: slower)


def attention_context_of(prompts: Iterable[tuple[int, int]]) -> float:
    """The mean attention context of the tokens prefilled for (prompt tokens, tokens already cached) pairs: sum
    of n (c + n/2) over sum of n, n = prompt - cached (the scheduler model's prefill cost charges each token
    its context; chunking a prompt does not change the sum). 0 without prompts."""
    tokens = products = 0.0
    for prompt, cached in prompts:
        new = max(0, prompt - max(0, cached))
        tokens += new
        products += new * (max(0, cached) + new / 2.0)
    return products / tokens if tokens > 0 else 0.0


class StepTimeEstimator:
    """Decayed least-squares statistics of decode step time; `fit` turns them into a CostModel."""

    def __init__(self, half_life_seconds: float = 3600.0, prior: CostModel | None = None) -> None:
        if not half_life_seconds > 0:
            raise ValueError(f"half_life_seconds must be > 0, got {half_life_seconds}")
        self.half_life_seconds = half_life_seconds
        self.prior = prior or CostModel()
        size = len(FEATURES)
        self.normal = np.zeros((size, size))  # sum of w * z z^T, z = features scaled by the prior coefficients
        self.moment = np.zeros(size)  # sum of w * z y
        self.weight = 0.0
        self.accept_sum = 0.0  # decayed with the weight: the mean accept length of the samples
        self.estimated_weight = 0.0  # ... and the weight of the samples whose prefill features were estimated
        # Decayed sums of the step time and of the default's time for the same sample (the prior-scaled features):
        # their ratio is the overall speed where the features are noisy (a regression on them would attenuate it).
        self.time_sum = 0.0
        self.default_time_sum = 0.0
        # Decayed sum of log(step time / the default's) over the estimated samples (their weight is
        # estimated_weight): the typical ratio an outlier is capped against.
        self.estimated_log_ratio_sum = 0.0
        self.last_time: float | None = None

    def _prior_vector(self) -> np.ndarray:
        return np.asarray([getattr(self.prior, name) for name in FEATURES], dtype=float)

    def _decay_to(self, now: float) -> None:
        if self.last_time is not None and now > self.last_time:
            factor = 0.5 ** ((now - self.last_time) / self.half_life_seconds)
            self.normal *= factor
            self.moment *= factor
            self.weight *= factor
            self.accept_sum *= factor
            self.estimated_weight *= factor
            self.estimated_log_ratio_sum *= factor
            self.time_sum *= factor
            self.default_time_sum *= factor
        self.last_time = now if self.last_time is None else max(self.last_time, now)

    def observe(self, now: float, samples: list[StepSample]) -> int:
        """Add samples; ones that cannot be read (no batch, no throughput, non-finite) are skipped. Returns how many
        were used."""
        self._decay_to(now)
        prior = self._prior_vector()
        used = 0
        for sample in samples:
            values = (sample.batch, sample.kv_tokens, sample.gen_throughput, sample.steps, sample.prefill_batches,
                      sample.prefill_tokens)
            if not all(math.isfinite(v) and v >= 0 for v in values):
                continue
            if sample.batch < 1 or sample.gen_throughput <= 0 or sample.steps <= 0:
                continue
            # Under speculative decoding a step is one verify pass, which yields accept_length tokens per request.
            accept = sample.accept_length if math.isfinite(sample.accept_length) and sample.accept_length >= 1 else 1.0
            seconds_per_step = sample.batch * accept / sample.gen_throughput
            features = np.asarray([1.0, sample.batch, sample.kv_tokens, sample.prefill_batches / sample.steps,
                                   sample.prefill_tokens / sample.steps])
            z = features * prior
            default_seconds = float(z.sum())  # what the default model takes for this sample
            if not sample.prefill_read and default_seconds > 0:
                if self.estimated_weight >= OUTLIER_MIN_SAMPLES:
                    typical = math.exp(self.estimated_log_ratio_sum / self.estimated_weight)
                    seconds_per_step = min(seconds_per_step, OUTLIER_FACTOR * typical * default_seconds)
                self.estimated_log_ratio_sum += math.log(max(seconds_per_step, 1e-9) / default_seconds)
            # Relative errors: a step of 5 ms and one of 200 ms count alike. Relative to the default's time for the
            # sample where the prefills are estimated: the step time then swings with the prefills the interval
            # happened to hold, and weighing by it would favour the intervals that held none.
            expected = seconds_per_step if sample.prefill_read else default_seconds
            w = 1.0 / max(expected, 1e-6) ** 2
            self.normal += w * np.outer(z, z)
            self.moment += w * z * seconds_per_step
            self.weight += 1.0
            self.accept_sum += accept
            self.estimated_weight += 0.0 if sample.prefill_read else 1.0
            self.time_sum += seconds_per_step
            self.default_time_sum += default_seconds
            used += 1
        return used

    def fit(self, draft_tokens: int = 0, attention_context: float = 0.0) -> StepTimeFit | None:
        """The cost model the samples imply, or None before any sample. With speculative decoding (`draft_tokens`
        > 0) the fitted per-request term holds the verify overhead, which the cost model keeps apart.

        `attention_context`: the traffic's prefilled tokens' mean attention context, sum of n (c + n/2) over sum
        of n for prompts prefilling n tokens on c already in KV (`attention_context_of`). A prefill line shows
        its tokens, not what they attend to, so a per-token cost fitted from the lines holds the attention term
        at that mean as well; it is split back into the two terms in the default's proportion (else a replay
        would charge the attention twice: 66K-token prompts' prefill came out 5% dear)."""
        if self.weight <= 0 or not np.isfinite(self.normal).all():
            return None
        ones = np.ones(len(FEATURES))
        # The default model scaled to the data: one factor for every coefficient.
        denominator = float(ones @ self.normal @ ones)
        if denominator <= 0:
            return None
        # Prefill features estimated from counters are too noisy to fit (the regression would shrink their costs
        # into the decode ones): the prefill costs keep the default's shape at the overall speed, taken as the
        # ratio of the step times to the default's (a regression on noisy features would read it fast), and the
        # decode costs are fitted to what the step time leaves.
        estimated = self.estimated_weight > 0.5 * self.weight
        if estimated and self.default_time_sum > 0:
            scale = self.time_sum / self.default_time_sum
        else:
            scale = float(ones @ self.moment) / denominator
        if not math.isfinite(scale) or scale <= 0:
            return None
        # A pull scaled by the trace (the base step's weight, nearly all of it) held the per-KV-token cost near the
        # default's shape: on a dense hybrid decoding 9x the default's per KV token, at twice its base, it came out
        # at 0.34x the server's (and its per-request cost 1.7x), which flattened the KV-bound side of its replays.
        diagonal = np.diag(self.normal)
        ridge = RIDGE * (diagonal + RIDGE_FLOOR * float(diagonal.mean()))
        free = np.arange(PREFILL_FEATURES) if estimated else np.arange(len(FEATURES))
        theta = scale * ones
        fixed = np.setdiff1d(np.arange(len(FEATURES)), free)
        if not (estimated and self.estimated_weight < ESTIMATED_SPLIT_SAMPLES):
            try:
                normal = self.normal[np.ix_(free, free)] + np.diag(ridge[free])
                moment = self.moment[free] - self.normal[np.ix_(free, fixed)] @ theta[fixed] + ridge[free] * scale
                theta[free] = np.linalg.solve(normal, moment)
            except np.linalg.LinAlgError:
                theta = scale * ones
        theta = np.clip(theta, scale / COEFFICIENT_RANGE, scale * COEFFICIENT_RANGE)
        coefficients = self._prior_vector() * theta
        if draft_tokens > 0:
            coefficients[1] /= 1.0 + self.prior.spec_verify_per_draft_token * draft_tokens
        fitted = dict(zip(FEATURES, (float(c) for c in coefficients), strict=True))
        if draft_tokens > 0 and self.accept_sum > 0:
            fitted["spec_accept_length"] = max(1.0, self.accept_sum / self.weight)
        # Prefill's attention term is not separately visible: it scales with the prefill per-token fit, which holds
        # it at the traffic's mean attention context where the prefill features were read.
        context_scale = float(theta[4])
        if not estimated and attention_context > 0 and self.prior.prefill_per_token_seconds > 0:
            share = self.prior.prefill_per_token_context_seconds / self.prior.prefill_per_token_seconds
            context_scale /= 1.0 + share * attention_context
            fitted["prefill_per_token_seconds"] = self.prior.prefill_per_token_seconds * context_scale
        cost = replace(
            self.prior, **fitted,
            prefill_per_token_context_seconds=self.prior.prefill_per_token_context_seconds * context_scale,
        )
        return StepTimeFit(cost=cost, samples=self.weight, speed_factor=scale)

    # -- checkpoint -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "half_life_seconds": self.half_life_seconds,
            "prior": self.prior.to_dict(),
            "normal": self.normal.tolist(),
            "moment": self.moment.tolist(),
            "weight": self.weight,
            "accept_sum": self.accept_sum,
            "estimated_weight": self.estimated_weight,
            "time_sum": self.time_sum,
            "default_time_sum": self.default_time_sum,
            "estimated_log_ratio_sum": self.estimated_log_ratio_sum,
            "last_time": self.last_time,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTimeEstimator:
        """Restore; raises ValueError (or KeyError/TypeError) on a checkpoint that is not ours."""
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"step-time checkpoint version {data.get('version')!r} is not {CHECKPOINT_VERSION}")
        estimator = cls(float(data["half_life_seconds"]), CostModel(**data["prior"]))
        normal = np.asarray(data["normal"], dtype=float)
        moment = np.asarray(data["moment"], dtype=float)
        size = len(FEATURES)
        if normal.shape != (size, size) or moment.shape != (size,):
            raise ValueError("step-time checkpoint has the wrong shape")
        estimator.normal, estimator.moment = normal, moment
        estimator.weight = float(data["weight"])
        estimator.accept_sum = float(data.get("accept_sum", data["weight"]))
        estimator.estimated_weight = float(data.get("estimated_weight", 0.0))
        estimator.time_sum = float(data.get("time_sum", 0.0))
        estimator.default_time_sum = float(data.get("default_time_sum", 0.0))
        # (a checkpoint written before the outlier cap: its estimated samples' typical ratio taken as the overall one)
        overall = estimator.time_sum / estimator.default_time_sum if estimator.default_time_sum > 0 else 1.0
        estimator.estimated_log_ratio_sum = float(data.get(
            "estimated_log_ratio_sum", estimator.estimated_weight * math.log(overall) if overall > 0 else 0.0))
        last = data["last_time"]
        estimator.last_time = None if last is None else float(last)
        return estimator
