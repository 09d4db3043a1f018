"""The online recommendation: from the workload picture and the dual-pool model to a target ratio, bounds,
a decision and its reason. Pure: everything it needs is passed in, `now` included.

r_target = r*(L_eff) * exp(state_bias * spikiness) * closed_loop, where
- r*(L_eff) uses the time-averaged L_eff over windows, and L_eff is the residence-weighted final context (what
  the KV pool must hold per running request). For a stationary point-mass workload this is the seed's r*
  exactly; for spread-out or heavy-tailed traffic it is below the request-mean formula's r (which
  over-provisions the state pool there); for traffic swinging between regimes it is r* at the time-averaged L,
  which the state bias then raises.
- state_bias is the one knob for the asymmetry (the state pool fails hard, the KV pool degrades); its default
  is chosen by `bench/quality.py`.
- closed_loop nudges r when the server's own signals contradict the model's predicted binding pool at the live
  config: saturated state pool with KV slack -> up; KV-blocked admission / retractions with an idle state pool
  -> down. Bounded to +-30%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from advisor.estimate.summary import WorkloadSummary
from advisor.model.advice import MemoryFacts, free_lever, state_for_split
from advisor.model.pools import (
    PIN_RATIO_THRESHOLD,
    ByteConstants,
    PoolSplit,
    balanced_concurrency,
    optimal_ratio_for,
    pin_size,
    split_pools,
)
from advisor.model.serving import ServingConfig, effective_draft_tokens, slots_per_request
from advisor.recommend.types import Recommendation


@dataclass(frozen=True)
class RecommenderSettings:
    # Chosen by bench/quality.py: of 0, 0.25, 0.5, 1.0, the largest whose goodput stays within 0.5% of the
    # best on every workload (0.25: min 99.8%, mean 100.1% of the oracle; 0.5 drops regime-shift to 98.7%).
    state_bias: float = 0.25
    min_requests: float = 100.0
    min_history_seconds: float = 30.0
    # A restart is worth it only above this predicted concurrency gain (VPA's 10% update threshold).
    min_gain: float = 0.10
    base_band: float = 0.10
    closed_loop_strength: float = 0.5
    closed_loop_limit: float = 0.3
    evidence_threshold: float = 0.2

    def __post_init__(self) -> None:
        if self.state_bias < 0:
            raise ValueError(f"state_bias must be >= 0, got {self.state_bias}")
        if self.min_gain < 0 or self.base_band < 0:
            raise ValueError("min_gain and base_band must be >= 0")


@dataclass
class ServerModel:
    """What the advisor knows of one server's pools (per GPU / per DP worker)."""

    serving: ServingConfig
    constants: ByteConstants | None = None
    rest_bytes: float | None = None
    observed_max_running_requests: int | None = None  # per DP worker
    observed_max_mamba_cache_size: int | None = None  # per DP shard
    kv_capacity_tokens: int | None = None
    model_context_len: int = 262144
    memory: MemoryFacts = field(default_factory=MemoryFacts)


@dataclass
class WorkloadPicture:
    summary: WorkloadSummary
    context_length: float | None  # time-averaged L_eff over windows (tokens)
    confidence: float


def live_ratio_of(model: ServerModel) -> float | None:
    """The live split as a ratio: the flag, or the effective state:KV bytes when the state pool is pinned."""
    serving = model.serving
    if serving.max_mamba_cache_size is None:
        return serving.mamba_full_memory_ratio
    if model.constants is None or model.rest_bytes is None:
        return None
    split = split_pools(model.rest_bytes, serving, model.constants, model_context_len=model.model_context_len)
    return split.state_pool_bytes / split.kv_pool_bytes if split.kv_pool_bytes > 0 else None


def recommend(
    model: ServerModel,
    picture: WorkloadPicture,
    settings: RecommenderSettings,
    *,
    inputs_stale: bool = False,
) -> Recommendation:
    """The recommendation; with `inputs_stale` the numbers are the last good estimate's, flagged as such."""
    rec = _recommend(model, picture, settings)
    if inputs_stale and rec.decision != "unified_memory":
        rec.reason = f"the last scrapes failed; showing the last good estimate ({rec.decision}): {rec.reason}"
        rec.decision = "inputs_stale"
    return rec


def _recommend(model: ServerModel, picture: WorkloadPicture, settings: RecommenderSettings) -> Recommendation:
    serving = model.serving
    summary = picture.summary
    live_ratio = live_ratio_of(model)
    base = Recommendation(
        decision="insufficient_data",
        reason="",
        live_ratio=live_ratio,
        confidence=min(1.0, picture.confidence),
        observed_max_running_requests=model.observed_max_running_requests,
    )
    if model.constants is not None:
        base.token_equiv = model.constants.token_equiv
        base.slots_per_request = slots_per_request(serving)
    if serving.unified_memory:
        base.decision = "unified_memory"
        base.reason = "the server runs --enable-unified-memory: there is no static split to tune; watch for starvation"
        return base
    if model.constants is None:
        base.reason = "byte constants unknown: no boot log and /server_info did not give the pool sizes"
        return base
    if (
        not picture.context_length
        or summary.requests_observed < settings.min_requests
        or summary.history_seconds < settings.min_history_seconds
    ):
        base.reason = (
            f"{summary.requests_observed:.0f} requests over {summary.history_seconds:.0f} s observed; need "
            f"{settings.min_requests:.0f} over {settings.min_history_seconds:.0f} s"
        )
        return base

    constants = model.constants
    context = float(picture.context_length)
    r_center = optimal_ratio_for(serving, constants, context)
    spikiness = summary.spikiness or 0.0
    bias = math.exp(settings.state_bias * spikiness)
    notes: list[str] = []

    # What the model predicts at the live config, for the closed loop and the report.
    live_split: PoolSplit | None = None
    live_binding: str | None = None
    live_kv_requests: float | None = None
    if model.rest_bytes is not None:
        live_split = split_pools(model.rest_bytes, serving, constants, model_context_len=model.model_context_len)
        live_kv_requests, live_binding = state_for_split(live_split, context, serving.dcp_size)
        observed = model.observed_max_running_requests
        if observed is not None and abs(observed - live_split.max_running_requests) > max(2, 0.05 * observed):
            notes.append(
                f"model predicts clamp {live_split.max_running_requests} at the live config, the server reports {observed}"
            )

    saturation = summary.state_pool_saturation_ratio or 0.0
    kv_blocked = summary.kv_blocked_ratio or 0.0
    retracting = (summary.retractions_per_second or 0.0) > 0
    loop = 0.0
    if live_binding is None:
        pass  # no pool sizes, no prediction to contradict
    elif saturation > settings.evidence_threshold and saturation > 2 * kv_blocked and live_binding != "state":
        loop = settings.closed_loop_strength * saturation
        notes.append(f"state pool saturated {saturation:.0%} of the time while the model expected {live_binding} to bind: nudged r up")
    elif (kv_blocked > settings.evidence_threshold and kv_blocked > 2 * saturation or retracting and saturation == 0.0) and live_binding == "state":
        loop = -settings.closed_loop_strength * max(kv_blocked, 0.2 if retracting else 0.0)
        notes.append(f"KV-blocked admission {kv_blocked:.0%} of the time with an idle state pool, against the model: nudged r down")
    loop = max(-settings.closed_loop_limit, min(settings.closed_loop_limit, loop))
    target = r_center * bias * math.exp(loop)

    confidence = min(1.0, picture.confidence)
    # Bounds widen while evidence is thin (VPA's confidence idea); spikiness acts through the bias, not here.
    band = settings.base_band + 0.5 * (1.0 - confidence)
    rec = base
    rec.ratio = target
    rec.ratio_lower = target * math.exp(-band)
    rec.ratio_upper = target * math.exp(band)
    rec.bias = bias * math.exp(loop) - 1.0
    rec.ratio_drift = math.log(live_ratio / target) if live_ratio else None
    rec.binding_pool_live = live_binding
    rec.kv_capacity_requests_live = live_kv_requests
    rec.predicted_max_running_requests_live = live_split.max_running_requests if live_split else None

    pin: int | None = None
    balanced_gain: float | None = None
    if model.rest_bytes is not None:
        rec_split = split_pools(model.rest_bytes, serving.with_ratio(target), constants, model_context_len=model.model_context_len)
        if target < PIN_RATIO_THRESHOLD or serving.dcp_size > 1:
            biased_context = context / (bias * math.exp(loop))
            concurrency = balanced_concurrency(model.rest_bytes, serving, constants, biased_context)
            pin = pin_size(concurrency, serving)
            pinned = ServingConfig(**{**serving.to_dict(), "max_mamba_cache_size": pin})
            rec_split = split_pools(model.rest_bytes, pinned, constants, model_context_len=model.model_context_len)
        rec_kv, rec_binding = state_for_split(rec_split, context, serving.dcp_size)
        rec.predicted_max_running_requests_recommended = rec_split.max_running_requests
        rec.kv_capacity_requests_recommended = rec_kv
        rec.binding_pool_recommended = rec_binding
        rec.recommended_max_mamba_cache_size = pin
        if live_split is not None and live_kv_requests is not None:
            live_concurrency = min(live_split.max_running_requests, live_kv_requests)
            rec_concurrency = min(rec_split.max_running_requests, rec_kv)
            rec.predicted_gain_ratio = rec_concurrency / live_concurrency if live_concurrency > 0 else None
            # What a change is worth at all: the balanced (unbiased) split's gain. The biased target sits past
            # the balance at the mean L on purpose, so its own predicted gain understates the value of moving.
            balanced_split = split_pools(model.rest_bytes, serving.with_ratio(r_center), constants,
                                         model_context_len=model.model_context_len)
            balanced_kv, _ = state_for_split(balanced_split, context, serving.dcp_size)
            if live_concurrency > 0:
                balanced_gain = min(balanced_split.max_running_requests, balanced_kv) / live_concurrency
    mfs, lever = free_lever(model.memory)
    rec.recommended_mem_fraction_static = mfs
    if lever:
        notes.insert(0, lever)

    direction = "up" if bias * math.exp(loop) > 1.0005 else ("down" if bias * math.exp(loop) < 0.9995 else "none")
    why = (
        f"L_eff {context:,.0f} tokens (request mean {summary.context_length_mean or 0:,.0f}), S={slots_per_request(serving)}"
        f"{', D=' + str(effective_draft_tokens(serving)) if effective_draft_tokens(serving) else ''}, "
        f"token_equiv {constants.token_equiv:,.0f} -> r* {r_center:.3g}"
    )
    if direction != "none":
        why += f"; biased {direction} x{bias * math.exp(loop):.2f} (spikiness {spikiness:.2f}{', closed loop' if loop else ''})"

    inside = live_ratio is not None and rec.ratio_lower <= live_ratio <= rec.ratio_upper
    gain = rec.predicted_gain_ratio
    worth = max(g for g in (gain, balanced_gain, 0.0) if g is not None)
    small_gain = gain is not None and worth < 1.0 + settings.min_gain
    if pin is not None and not (serving.max_mamba_cache_size is not None and abs(serving.max_mamba_cache_size - pin) <= 0.1 * pin):
        rec.decision = "pin_state_pool"
        reason = "under DCP the balance point is beyond realistic L" if serving.dcp_size > 1 else f"r {target:.3g} < {PIN_RATIO_THRESHOLD} is fragile"
        rec.reason = f"pin --max-mamba-cache-size {pin}: {reason}; {why}"
    elif inside or small_gain or live_ratio is None:
        rec.decision = "hold"
        if live_ratio is None:
            rec.reason = "live ratio unknown (pinned state pool without pool sizes); " + why
        elif inside:
            rec.reason = f"live r {live_ratio:.3g} is inside [{rec.ratio_lower:.3g}, {rec.ratio_upper:.3g}]; " + why
        else:
            rec.reason = f"predicted gain {(worth - 1) * 100:.0f}% is below the {settings.min_gain:.0%} worth a restart; " + why
    else:
        rec.decision = "raise_ratio" if target > live_ratio else "lower_ratio"
        binds = f"the {live_binding} pool binds at the live r {live_ratio:.3g}" if live_binding else f"live r {live_ratio:.3g}"
        gain_text = f" (+{((gain or 1.0) - 1) * 100:.0f}% concurrency)" if gain else ""
        rec.reason = f"{binds}; r {target:.3g}{gain_text}: {why}"
    if pin is not None:
        rec.flag_line = f"--max-mamba-cache-size {pin}"
    else:
        rec.flag_line = f"--mamba-full-memory-ratio {target:.3g}"
    if mfs is not None:
        rec.flag_line += f" --mem-fraction-static {mfs:.2f}"
    rec.notes = notes
    return rec
