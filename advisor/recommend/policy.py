"""The recommender's policy in three pure steps: the closed-loop nudge (does the server contradict the model?),
the pool outcomes (clamp, KV capacity and binding pool at the live, recommended and balanced splits), and the
decision with its machine-readable reason code. `engine.recommend` composes them; tests drive each by table."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.estimate.summary import WorkloadSummary
from advisor.model.advice import PinChoice, pin_choice, state_for_split
from advisor.model.pools import PIN_RATIO_THRESHOLD, ByteConstants, PoolSplit, split_pools
from advisor.model.serving import ServingConfig

# Why a decision was taken; `Recommendation.reason_code` carries one of these (tests and alerts read the code,
# people read `reason`).
REASON_CODES = (
    "unified_memory",  # no static split to tune
    "no_constants",  # byte constants unknown
    "not_enough_data",  # too few requests or too little history
    "pin_dcp",  # pin: under DCP the balance point is beyond realistic L
    "pin_fragile_ratio",  # pin: r below the pin threshold
    "pin_thin_state_budget",  # pin: the state budget holds under two requests' worth
    "pinned_as_recommended",  # hold: the live pin is within 10% of the recommended one
    "live_ratio_unknown",  # hold: a pinned pool without pool sizes has no ratio to compare
    "inside_bounds",  # hold: the live r is inside the confidence-widened bounds
    "gain_below_threshold",  # hold: moving is worth less than min_gain of concurrency
    "state_pool_short",  # raise_ratio
    "kv_pool_short",  # lower_ratio
    "inputs_stale",  # the last scrapes failed; the numbers are the last good estimate's
)


@dataclass(frozen=True)
class Nudge:
    """The closed loop's correction: r is multiplied by exp(log_factor); `evidence` says what contradicted the model."""

    log_factor: float = 0.0
    evidence: str | None = None  # "state_saturated" | "kv_blocked" | None


def closed_loop_nudge(
    summary: WorkloadSummary,
    live_binding: str | None,
    *,
    evidence_threshold: float,
    strength: float,
    limit: float,
) -> Nudge:
    """Nudge r when the server's own signals contradict the model's predicted binding pool at the live config:
    a state pool saturated (with KV slack) when the model expected the KV pool or balance -> up; KV-blocked
    admission or retractions with an idle state pool when the model expected the state pool -> down. No
    prediction (no pool sizes), no nudge. Bounded to +-limit in log space."""
    if live_binding is None:
        return Nudge()
    saturation = summary.state_pool_saturation_ratio or 0.0
    kv_blocked = summary.kv_blocked_ratio or 0.0
    retracting = (summary.retractions_per_second or 0.0) > 0
    if saturation > evidence_threshold and saturation > 2 * kv_blocked and live_binding != "state":
        return Nudge(min(limit, strength * saturation), "state_saturated")
    kv_evidence = kv_blocked > evidence_threshold and kv_blocked > 2 * saturation
    if (kv_evidence or (retracting and saturation == 0.0)) and live_binding == "state":
        return Nudge(-min(limit, strength * max(kv_blocked, 0.2 if retracting else 0.0)), "kv_blocked")
    return Nudge()


@dataclass(frozen=True)
class PoolOutcome:
    """One split at one context length: the state clamp, the KV pool's capacity in requests, which binds."""

    split: PoolSplit
    kv_capacity_requests: float
    binding_pool: str

    @property
    def concurrency(self) -> float:
        """Requests per DP worker the split admits at that L: the smaller of the two pools' limits."""
        return min(self.split.max_running_requests, self.kv_capacity_requests)


def pool_outcome(
    rest_bytes: float, serving: ServingConfig, constants: ByteConstants, context_length: float, model_context_len: int
) -> PoolOutcome:
    split = split_pools(rest_bytes, serving, constants, model_context_len=model_context_len)
    kv_requests, binding = state_for_split(split, context_length, serving.dcp_size)
    return PoolOutcome(split, kv_requests, binding)


@dataclass(frozen=True)
class PoolOutcomes:
    live: PoolOutcome
    recommended: PoolOutcome
    balanced: PoolOutcome  # at r*(L) without bias or nudge: what a change is worth at all
    pin: PinChoice | None

    @property
    def gain(self) -> float | None:
        """Concurrency at the recommended split over the live one (1.0 = no gain)."""
        return self.recommended.concurrency / self.live.concurrency if self.live.concurrency > 0 else None

    @property
    def balanced_gain(self) -> float | None:
        return self.balanced.concurrency / self.live.concurrency if self.live.concurrency > 0 else None


def pool_outcomes(
    rest_bytes: float,
    serving: ServingConfig,
    constants: ByteConstants,
    *,
    live: PoolOutcome,
    context_length: float,
    target_ratio: float,
    balanced_ratio: float,
    bias_factor: float,
    model_context_len: int,
    pin_ratio_threshold: float = PIN_RATIO_THRESHOLD,
) -> PoolOutcomes:
    """With the live split (`pool_outcome` at the live config, computed once by the caller): the recommended
    split (the target ratio, or the pin when the pin rule says so, at `pin_ratio_threshold`) and the balanced one.
    The pin admits the balanced concurrency at the biased L (context / bias_factor)."""
    pin = pin_choice(target_ratio, serving, constants, rest_bytes, context_length / bias_factor, pin_ratio_threshold)
    if pin is not None:
        recommended_config = ServingConfig(**{**serving.to_dict(), "max_mamba_cache_size": pin.max_mamba_cache_size})
    else:
        recommended_config = serving.with_ratio(target_ratio)
    recommended = pool_outcome(rest_bytes, recommended_config, constants, context_length, model_context_len)
    balanced = pool_outcome(rest_bytes, serving.with_ratio(balanced_ratio), constants, context_length, model_context_len)
    return PoolOutcomes(live, recommended, balanced, pin)


# The fragile-ratio pin's hysteresis: a pin advised before stands while the target stays under the threshold times
# this factor, and a move of the ratio advised before while it stays above the threshold over it. Between replays
# of the same traffic the chosen ratio wanders by about this much (0.12-0.16 on one regime of the quality bench),
# and each crossing of 0.15 would otherwise turn a pin into a lower and back.
PIN_KEEP_FACTOR = 1.25


def pin_ratio_threshold(previous_decision: str | None, previous_reason_code: str | None) -> float:
    """PIN_RATIO_THRESHOLD moved by the last decision: up after a fragile-ratio pin, down after a move of the
    ratio."""
    if previous_decision == "pin_state_pool" and previous_reason_code == "pin_fragile_ratio":
        return PIN_RATIO_THRESHOLD * PIN_KEEP_FACTOR
    if previous_decision in ("raise_ratio", "lower_ratio"):
        return PIN_RATIO_THRESHOLD / PIN_KEEP_FACTOR
    return PIN_RATIO_THRESHOLD


@dataclass(frozen=True)
class Decision:
    decision: str
    reason_code: str


def decide(
    *,
    target_ratio: float,
    ratio_lower: float,
    ratio_upper: float,
    live_ratio: float | None,
    live_pin: int | None,
    pin: PinChoice | None,
    gain: float | None,
    balanced_gain: float | None,
    min_gain: float,
) -> Decision:
    """The decision once the numbers are known. A pin wins unless the live pin is within 10% of it; then hold
    when the live r is unknown, inside the bounds, or moving gains under `min_gain` of concurrency (judged on
    the larger of the recommended and the balanced split's gain: the bias sits past the balance on purpose,
    so its own gain understates the value of moving); otherwise raise or lower r."""
    if pin is not None:
        if live_pin is not None and abs(live_pin - pin.max_mamba_cache_size) <= 0.1 * pin.max_mamba_cache_size:
            return Decision("hold", "pinned_as_recommended")
        return Decision("pin_state_pool", f"pin_{pin.why}")
    if live_ratio is None:
        return Decision("hold", "live_ratio_unknown")
    if ratio_lower <= live_ratio <= ratio_upper:
        return Decision("hold", "inside_bounds")
    worth = max(g for g in (gain, balanced_gain, 0.0) if g is not None)
    if gain is not None and worth < 1.0 + min_gain:
        return Decision("hold", "gain_below_threshold")
    if target_ratio > live_ratio:
        return Decision("raise_ratio", "state_pool_short")
    return Decision("lower_ratio", "kv_pool_short")
