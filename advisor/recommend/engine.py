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
from dataclasses import dataclass, field, replace

from advisor.estimate.summary import WorkloadSummary
from advisor.model.advice import PIN_REASONS, MemoryFacts, caveats, clamp_mismatch, flag_line, free_lever
from advisor.model.pools import ByteConstants, optimal_ratio_for, pin_size, split_pools, unified_memory_cap
from advisor.model.serving import (
    ServingConfig,
    effective_draft_tokens,
    slots_per_request,
)
from advisor.recommend.policy import (
    Decision,
    Nudge,
    PoolOutcome,
    PoolOutcomes,
    closed_loop_nudge,
    decide,
    pin_ratio_threshold,
    pool_outcome,
    pool_outcomes,
)
from advisor.recommend.replay import ReplayCurve, ReplaySettings
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
    # With a what-if replay: a restart is worth it above this predicted goodput gain (twice the replay's usual
    # noise, 0.75%), and a move already advised stands until its gain falls below this share of it. Chosen by
    # bench/quality.py: over seven protocols, 12 holds at 0.9 under the 3% bar became moves at 1.5% and gained
    # 0.6-6 points, and one lost 0.5 (agent sessions on the L40S).
    min_goodput_gain: float = 0.015
    keep_gain_share: float = 1.0 / 3.0
    # The server served its traffic at the live ratio without a pool failing when its clamp saturated with a
    # queue, and KV blocked a queue, each under this share of the time, and nothing was retracted. A replay whose
    # own batch at the live ratio is not the server's pictured other traffic than what the server served: its
    # curve is not acted on.
    served_failure_share: float = 0.02

    def __post_init__(self) -> None:
        if self.state_bias < 0:
            raise ValueError(f"state_bias must be >= 0, got {self.state_bias}")
        if self.min_gain < 0 or self.base_band < 0:
            raise ValueError("min_gain and base_band must be >= 0")
        if not 0 <= self.keep_gain_share <= 1:
            raise ValueError(f"keep_gain_share must be in [0, 1], got {self.keep_gain_share}")
        if not 0 <= self.served_failure_share <= 1:
            raise ValueError(f"served_failure_share must be in [0, 1], got {self.served_failure_share}")


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
    replay: ReplayCurve | None = None  # the observed traffic replayed at candidate ratios around the prior
    # The replay runs but has seen less traffic than it needs: wait for it rather than decide on the prior alone
    # and change the decision once it speaks (seconds of traffic seen, needed).
    replay_warming_up: tuple[float, float] | None = None
    # ... or has seen the time but fewer requests in its window than a recommendation needs (requests seen, needed)
    replay_waiting_requests: tuple[int, int] | None = None
    # The replay is due but the cycle's replay budget went to other servers before its first curve: the closed
    # form answers (and says so) until a later cycle replays it.
    replay_deferred: bool = False


def prior_ratio(model: ServerModel, picture: WorkloadPicture, settings: RecommenderSettings) -> float | None:
    """The closed-form prior: r*(L_eff) with the spikiness bias (no closed-loop nudge); what the replay's
    candidates centre on and what decides where its curve is flat. None while it cannot be computed."""
    if model.constants is None or not picture.context_length:
        return None
    spikiness = picture.summary.spikiness or 0.0
    r_center = optimal_ratio_for(model.serving, model.constants, float(picture.context_length))
    return r_center * math.exp(settings.state_bias * spikiness)


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
    previous: Recommendation | None = None,
) -> Recommendation:
    """The recommendation; with `inputs_stale` the numbers are the last good estimate's, flagged as such.
    `previous` (the last cycle's) gives the replayed-gain threshold its hysteresis, and its move stands
    against a replay the server contradicts."""
    rec = _recommend(model, picture, settings, previous)
    if inputs_stale and rec.decision != "unified_memory":
        rec.reason = f"the last scrapes failed; showing the last good estimate ({rec.decision}): {rec.reason}"
        rec.decision, rec.reason_code = "inputs_stale", "inputs_stale"
    return rec


def _unified_memory(base: Recommendation, model: ServerModel, picture: WorkloadPicture) -> Recommendation:
    """--enable-unified-memory: no byte split to tune, but the state pool's size still caps concurrency
    (`advisor.model.pools.unified_memory_cap`): advise on the cap."""
    base.decision, base.reason_code = "unified_memory", "unified_memory"
    base.reason = "the server runs --enable-unified-memory: the bytes float at run time; watch for starvation"
    if model.constants is None or model.rest_bytes is None or not picture.context_length:
        return base
    cap = unified_memory_cap(model.rest_bytes, model.serving, model.constants, float(picture.context_length),
                             model_context_len=model.model_context_len)
    base.predicted_max_running_requests_live = cap.live_cap
    base.recommended_max_mamba_cache_size = cap.recommended_max_mamba_cache_size
    if cap.cap_binds:
        base.flag_line = f"--max-mamba-cache-size {cap.recommended_max_mamba_cache_size}"
        base.reason = (
            f"the server runs --enable-unified-memory: the bytes float, but max_mamba_cache_size // S caps it at "
            f"{cap.live_cap} running requests per worker while memory holds {cap.supported_concurrency:.0f} of "
            f"{picture.context_length:.0f} tokens: raise the cap"
        )
    else:
        base.reason = (
            f"the server runs --enable-unified-memory: the bytes float; its cap of {cap.live_cap} running requests per "
            f"worker admits the {cap.supported_concurrency:.0f} that memory holds at {picture.context_length:.0f} tokens"
        )
    return base


def _recommend(
    model: ServerModel, picture: WorkloadPicture, settings: RecommenderSettings, previous: Recommendation | None = None,
) -> Recommendation:
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
        return _unified_memory(base, model, picture)
    if model.constants is None:
        base.reason_code = "no_constants"
        base.reason = "byte constants unknown: no boot log and /server_info did not give the pool sizes"
        return base
    if (
        not picture.context_length
        or summary.requests_observed < settings.min_requests
        or summary.history_seconds < settings.min_history_seconds
    ):
        base.reason_code = "not_enough_data"
        base.reason = (
            f"{summary.requests_observed:.0f} requests over {summary.history_seconds:.0f} s observed; need "
            f"{settings.min_requests:.0f} over {settings.min_history_seconds:.0f} s"
        )
        return base

    if picture.replay is None and picture.replay_warming_up is not None:
        seen, needed = picture.replay_warming_up
        base.reason_code = "not_enough_data"
        base.reason = f"the what-if replay waits for {needed:.0f} s of observed traffic; {seen:.0f} s so far"
        return base
    if picture.replay is None and picture.replay_waiting_requests is not None:
        held, wanted = picture.replay_waiting_requests
        base.reason_code = "not_enough_data"
        base.reason = f"the what-if replay waits for {wanted} requests in its window; {held} so far"
        return base

    constants = model.constants
    context = float(picture.context_length)
    r_center = optimal_ratio_for(serving, constants, context)
    spikiness = summary.spikiness or 0.0
    bias = math.exp(settings.state_bias * spikiness)
    notes: list[str] = []

    live: PoolOutcome | None = None
    if model.rest_bytes is not None:
        live = pool_outcome(model.rest_bytes, serving, constants, context, model.model_context_len)
        mismatch = clamp_mismatch(live.split.max_running_requests, model.observed_max_running_requests)
        if mismatch:
            notes.append(mismatch)
    nudge = closed_loop_nudge(
        summary, live.binding_pool if live else None, evidence_threshold=settings.evidence_threshold,
        strength=settings.closed_loop_strength, limit=settings.closed_loop_limit,
    )
    if nudge.evidence == "state_saturated":
        notes.append(
            f"state pool saturated {summary.state_pool_saturation_ratio or 0:.0%} of the time while the model expected "
            f"{live.binding_pool if live else '-'} to bind: nudged r up"
        )
    elif nudge.evidence == "kv_blocked":
        notes.append(
            f"KV-blocked admission {summary.kv_blocked_ratio or 0:.0%} of the time with an idle state pool, against the "
            "model: nudged r down"
        )
    notes.extend(caveats(serving, constants))
    factor = bias * math.exp(nudge.log_factor)
    base.nudge_evidence = nudge.evidence
    target = r_center * factor

    confidence = min(1.0, picture.confidence)
    # Bounds widen while evidence is thin (VPA's confidence idea); spikiness acts through the bias, not here.
    band = settings.base_band + 0.5 * (1.0 - confidence)
    rec = base
    replay = picture.replay
    kept: KeptMove | None = None
    if replay is not None:
        # The replayed curve decides; its plateau (the ratios within its noise of the best) is the hold band.
        target = replay.chosen_ratio
        factor = target / r_center
        rec.ratio_lower, rec.ratio_upper = replay.hold_lower, replay.hold_upper
        rec.predicted_goodput_gain_ratio = replay.gain
        rec.goodput_curve_width_ratio = replay.width_ratio
        rec.goodput_plateau = (replay.width_lower, replay.width_upper)
        rec.goodput_curve = [(p.ratio, p.goodput) for p in replay.points]
        rec.replay_metric = replay.metric
        rec.replay_requests, rec.replay_window_seconds = replay.requests, replay.window_seconds
        rec.replay_source = replay.source
        rec.replay_regime_seconds = replay.regime_seconds
        # the load a trend was followed at (not one the server's queue asked for: that is replay_queue_load)
        rec.replay_trend_load = replay.trend_load if not _queue_followed(replay) else None
        rec.replay_draws = replay.draws
        rec.step_time_coefficients = dict(replay.step_time)
        rec.replay_live_context_shown = replay.live_context_shown
        rec.replay_live_context_replayed = replay.live_context_replayed
        rec.replay_live_running_shown = replay.live_running_shown
        rec.replay_live_running_replayed = replay.live_running_replayed
        rec.replay_queue_shown, rec.replay_queue_replayed = replay.queue_shown, replay.queue_replayed
        rec.replay_queue_load = replay.queue_load
        rec.replay_admission_rate_shown = replay.admission_rate_shown
        rec.replay_admission_rate_replayed = replay.admission_rate_replayed
        rec.replay_work_scale = replay.work_scale
        shown_running, replayed_running = replay.live_running_shown, replay.live_running_replayed
        contradicted = live_ratio is not None and _replay_contradicted(replay, summary, settings)
        if replay.live_running_matches is False and shown_running and replayed_running and not contradicted:
            notes.append(
                f"the replay at the live r runs {replayed_running:.3g} requests at once where the server ran "
                f"{shown_running:.3g}: its picture of the traffic is off, read its curve with care"
            )
        elif (replay.live_context_shown and replay.live_context_replayed_before and replay.live_context_replayed
                and replay.live_context_replayed != replay.live_context_replayed_before):
            notes.append(
                f"the replay's running batch at the live r held {replay.live_context_replayed_before:,.0f} tokens a "
                f"request where the server showed {replay.live_context_shown:,.0f}: outputs paired again to the "
                f"prompts ({replay.live_context_replayed:,.0f})"
            )
        if (replay.work_scale is not None and replay.admission_rate_shown is not None
                and replay.admission_rate_replayed is not None):
            notes.append(
                f"the replay at the live r admitted {replay.admission_rate_replayed:.3g} requests/s where the server "
                f"admitted {replay.admission_rate_shown:.3g} (its queue-time histogram's count): the picture's "
                f"outputs scaled by {replay.work_scale:.3g} to match, as a full pool admits at the turnover "
                f"its requests' outputs set"
            )
        read = _plateaus_read(replay)
        if read:
            notes.append(read)
        if replay.draws > 1:
            notes.append(f"without request logs the traffic is one draw of what the histograms allow: the curve is "
                         f"the mean of {replay.draws} replays' draws")
        if replay.flat and replay.lean_from is not None:
            notes.append(
                f"replayed goodput is flat within its noise over r {replay.width_lower:.3g}-{replay.width_upper:.3g}; "
                f"with the traffic {replay.lean_load or 1:.3g}x heavier, r {replay.chosen_ratio:.3g} scores "
                f"{((replay.lean_gain or 1) - 1) * 100:+.1f}% over its middle r {replay.lean_from:.3g}: the advice "
                "leans there"
            )
        elif replay.flat:
            notes.append(
                f"replayed goodput is flat within its noise over r {replay.width_lower:.3g}-{replay.width_upper:.3g}: "
                f"its middle, r {replay.chosen_ratio:.3g}, is furthest from where it falls"
            )
        if contradicted and live_ratio is not None:
            # The server is the evidence at its own ratio: it served without either pool failing, so no ratio
            # serves this traffic better, and a replay that says otherwise pictured other traffic. A move a
            # trusted replay advised before stands: a picture that is off says nothing against it.
            kept = kept_move(previous, live_ratio)
            contradiction = (
                f"the replay at the live r {live_ratio:.3g} runs {replay.live_running_replayed or 0:.3g} requests at "
                f"once, where the server ran {replay.live_running_shown or 0:.3g} with neither pool failing: its "
                f"picture of the traffic is off"
            )
            if kept is not None:
                target = kept.ratio
                rec.predicted_goodput_gain_ratio = kept.goodput_gain
                rec.ratio_lower, rec.ratio_upper = kept.ratio_lower, kept.ratio_upper
                notes.append(f"{contradiction}, and the move to r {target:.3g} advised before stands")
            else:
                target = live_ratio
                rec.predicted_goodput_gain_ratio = 1.0  # the live r itself
                rec.ratio_lower = min(replay.hold_lower, live_ratio / CONTRADICTED_HOLD_FACTOR)
                rec.ratio_upper = max(replay.hold_upper, live_ratio * CONTRADICTED_HOLD_FACTOR)
                notes.append(f"{contradiction}, and the live r, which served it, stands")
            factor = target / r_center
        elif live_ratio is not None and _would_hold(replay, settings, previous, live_ratio):
            # A move advised before stands while its target still scores on the replayed plateau (within twice
            # the replay's noise of the best): each replay's draw moves the plateau and its middle, and a live
            # ratio near the hold band's edge would otherwise see the same move advised, dropped and advised again.
            kept = kept_move(previous, live_ratio)
            floor = replay.goodput_at(replay.best_ratio) * (1.0 - KEEP_PLATEAU_NOISE_FACTOR * replay.plateau_tolerance)
            if kept is not None and replay.goodput_at(kept.ratio) >= floor:
                target = kept.ratio
                rec.predicted_goodput_gain_ratio = replay.gain_at(kept.ratio)
                rec.ratio_lower, rec.ratio_upper = kept.ratio_lower, kept.ratio_upper
                factor = target / r_center
                notes.append(
                    f"the move to r {target:.3g} advised before stands: the replayed goodput there is still within "
                    f"its noise of the best (plateau r {replay.width_lower:.3g}-{replay.width_upper:.3g})"
                )
            else:
                kept = None
    else:
        rec.ratio_lower = target * math.exp(-band)
        rec.ratio_upper = target * math.exp(band)
        if picture.replay_deferred:
            notes.append("the what-if replay has not reached this server yet (the cycle's replay budget went to "
                         "others first): the closed form answers until a later cycle replays it")
    rec.ratio = target
    rec.bias = factor - 1.0
    rec.ratio_drift = math.log(live_ratio / target) if live_ratio else None

    outcomes: PoolOutcomes | None = None
    if model.rest_bytes is not None and live is not None:
        outcomes = pool_outcomes(
            model.rest_bytes, serving, constants, live=live, context_length=context, target_ratio=target,
            balanced_ratio=r_center, bias_factor=factor, model_context_len=model.model_context_len,
            pin_ratio_threshold=pin_ratio_threshold(previous.decision if previous else None,
                                                    previous.reason_code if previous else None),
        )
        if replay is not None and outcomes.pin is not None:
            # The pin holds the replay's chosen clamp: the whole requests' worth of slots the chosen ratio's state
            # pool holds (max_running_requests is max_mamba_cache_size // S, so the chosen pool's remainder buys no
            # concurrency, and pinned away it is KV: on `dcp8` 374 slots clamp at 74 as 370 do, 4,065 KV tokens a
            # slot dearer).
            chosen = split_pools(model.rest_bytes, serving.with_ratio(target), constants,
                                 model_context_len=model.model_context_len)
            whole_requests = chosen.max_mamba_cache_size // slots_per_request(serving)
            outcomes = replace(outcomes, pin=replace(outcomes.pin,
                                                     max_mamba_cache_size=pin_size(whole_requests, serving)))
        rec.binding_pool_live = live.binding_pool
        rec.kv_capacity_requests_live = live.kv_capacity_requests
        rec.predicted_max_running_requests_live = live.split.max_running_requests
        rec.predicted_max_running_requests_recommended = outcomes.recommended.split.max_running_requests
        rec.kv_capacity_requests_recommended = outcomes.recommended.kv_capacity_requests
        rec.binding_pool_recommended = outcomes.recommended.binding_pool
        rec.recommended_max_mamba_cache_size = outcomes.pin.max_mamba_cache_size if outcomes.pin else None
        rec.predicted_gain_ratio = outcomes.gain
    mfs, lever = free_lever(model.memory)
    rec.recommended_mem_fraction_static = mfs
    if lever:
        notes.insert(0, lever)

    min_gain = settings.min_gain  # the bar the decision was held to (read by `_reason`)
    if kept is not None:
        decision = Decision(kept.decision, kept.reason_code)  # decided when it was advised
    else:
        gain, balanced_gain, min_gain = _gain_bar(replay, outcomes, settings, previous, target, live_ratio)
        decision = decide(
            target_ratio=target, ratio_lower=rec.ratio_lower, ratio_upper=rec.ratio_upper, live_ratio=live_ratio,
            live_pin=serving.max_mamba_cache_size, pin=outcomes.pin if outcomes else None,
            gain=gain, balanced_gain=balanced_gain, min_gain=min_gain,
        )
    rec.decision, rec.reason_code = decision.decision, decision.reason_code
    robust_gain = replay.robust_gain if replay is not None else None
    headroom_gain = replay.headroom_gain if replay is not None else None
    moves = decision.decision in ("raise_ratio", "lower_ratio") and kept is None
    if moves and replay is not None and robust_gain and robust_gain > (replay.gain or 0):
        notes.append(
            f"the live r {live_ratio:.3g} sits close to where the replayed goodput falls off: r {target:.3g} gains "
            f"{(robust_gain - 1) * 100:+.1f}% in the worst case within the replay's margin"
        )
    if moves and replay is not None and headroom_gain and headroom_gain > max(replay.gain or 0, robust_gain or 0):
        notes.append(
            f"the live r {live_ratio:.3g} only just serves the observed traffic: with it {replay.headroom:.3g}x "
            f"heavier, r {target:.3g} gains {(headroom_gain - 1) * 100:+.1f}%"
        )
    rec.reason = _reason(rec, summary, serving, constants, context, r_center, bias, factor, spikiness, nudge, min_gain)
    pin = rec.recommended_max_mamba_cache_size
    rec.flag_line = flag_line(target, pin, mfs)
    rec.notes = notes
    return rec


def _queue_followed(replay: ReplayCurve) -> bool:
    """The heavier traffic the replay followed is the load that queued as the server did, not a trend's."""
    return (replay.trend_load is not None and replay.queue_load is not None
            and math.isclose(replay.trend_load, replay.queue_load))


def _plateaus_read(replay: ReplayCurve) -> str | None:
    """Which two plateaus the advice was read from, after a regime shift or under a trend (None otherwise)."""
    if replay.window_plateau is None:
        return None
    if replay.regime_seconds is not None and replay.regime_plateau is not None:
        (low, high), whole = replay.regime_plateau, "the whole window"
        what = (f"the traffic changed character {replay.regime_seconds / 60:.0f} min before the replay's end: the new "
                "regime, replayed as if it had filled the window,")
        apart = "no ratio holds both, and the advice is read where the worse of the two scores best"
    elif replay.trend_plateau is not None and _queue_followed(replay):
        (low, high), whole = replay.trend_plateau, "the window as replayed"
        what = (f"the server queued more than the replay: {replay.queue_shown or 0:.0%} of its requests waited "
                f"beyond the queue bound against {replay.queue_replayed or 0:.0%} replayed at the live r; the "
                f"window replayed {replay.trend_load:.2f}x heavier, as the server queued,")
        apart = "no ratio holds both: the advice follows the window as replayed"
    elif replay.trend_load is not None and replay.trend_plateau is not None:
        (low, high), whole = replay.trend_plateau, "the window as observed"
        what = (f"the traffic is rising: the replay window's last minutes came {replay.trend_load:.2f}x as fast as "
                "the window; that heavier traffic")
        apart = "no ratio holds both: the advice follows the window as observed until the heavier traffic comes"
    else:
        return None
    window_low, window_high = replay.window_plateau
    return (f"{what} is on its plateau over r {low:.3g}-{high:.3g}, {whole} over r {window_low:.3g}-"
            f"{window_high:.3g}; " + ("the advice is read where both hold" if replay.reads_both_plateaus else apart))


# The restart bar's multiple for a replay whose running batch at the live ratio is not the server's (the 3% every
# replay once had to pass): from /metrics alone such a picture's next draw moved agent sessions on one GPU from a
# hold to a lower and back, on gains between the two bars.
OFF_PICTURE_BAR_FACTOR = 2.0


def _gain_bar(replay: ReplayCurve | None, outcomes: PoolOutcomes | None, settings: RecommenderSettings,
              previous: Recommendation | None, target: float, live_ratio: float | None,
              ) -> tuple[float | None, float | None, float]:
    """(the gain of moving, the balanced split's gain, the bar it must pass) for `decide`."""
    if replay is not None and replay.gain is not None:
        # The plain gain on the observed traffic, the margin-robust one for a live ratio next to a cliff, or the one
        # on heavier traffic for a live ratio that only just serves the observed draw. That last is two runs on
        # traffic nobody observed, with no curve around them: it counts beyond the replay's noise only.
        heavier = (replay.headroom_gain / (1.0 + replay.plateau_tolerance)
                   if replay.headroom_gain is not None else None)
        gain = max(g for g in (replay.gain, replay.robust_gain, heavier) if g is not None)
        # Hysteresis: a move already advised in this direction stands until its gain falls below a third of the
        # bar, so a gain hovering at the threshold does not flip the decision every replay; and a move advised
        # for a cliff stands while the cliff stays within the replay's wider keep margin.
        # A replay whose batch at the live ratio is not the server's pictured other traffic: its gains are read
        # against a bar OFF_PICTURE_BAR_FACTOR times higher.
        bar = settings.min_goodput_gain * (OFF_PICTURE_BAR_FACTOR if replay.live_running_matches is False else 1.0)
        direction = "raise_ratio" if live_ratio is not None and target > live_ratio else "lower_ratio"
        if previous is not None and previous.decision == direction:
            gain = max(g for g in (gain, replay.keep_robust_gain) if g is not None)
            return gain, None, bar * settings.keep_gain_share
        return gain, None, bar
    if outcomes is None:
        return None, None, settings.min_gain
    return outcomes.gain, outcomes.balanced_gain, settings.min_gain


def _would_hold(replay: ReplayCurve, settings: RecommenderSettings, previous: Recommendation | None,
                live_ratio: float) -> bool:
    """The replay alone would hold: the live ratio inside its hold band, or moving gains under the bar."""
    if replay.hold_lower <= live_ratio <= replay.hold_upper:
        return True
    gain, _, bar = _gain_bar(replay, None, settings, previous, replay.chosen_ratio, live_ratio)
    return gain is not None and gain < 1.0 + bar


# A move advised before stands while its target scores within this many times the replay's plateau tolerance of
# the best.
KEEP_PLATEAU_NOISE_FACTOR = 2.0
# The replay's min_move: no smaller move is advised (its hold band spans at least that much either side of a chosen
# ratio). It is the hold band around a live ratio kept against a contradicted replay, and how close a live ratio must
# come to a move advised before to have taken it.
CONTRADICTED_HOLD_FACTOR = APPLIED_MOVE_FACTOR = ReplaySettings().min_move


@dataclass(frozen=True)
class KeptMove:
    """A move advised before, kept against a replay the server contradicts."""

    decision: str
    reason_code: str
    ratio: float
    ratio_lower: float
    ratio_upper: float
    goodput_gain: float | None


def kept_move(previous: Recommendation | None, live_ratio: float) -> KeptMove | None:
    """The last cycle's advice when it was a move of the live ratio that still points the same way from it, and
    by more than APPLIED_MOVE_FACTOR: a server restarted at the advised ratio, as the flag line rounds it, has
    taken the move (r 7.2 for an advised 7.205 is not a raise still to make)."""
    if previous is None or previous.ratio is None or previous.ratio_lower is None or previous.ratio_upper is None:
        return None
    raises = previous.decision == "raise_ratio" and previous.ratio > live_ratio * APPLIED_MOVE_FACTOR
    lowers = previous.decision == "lower_ratio" and previous.ratio * APPLIED_MOVE_FACTOR < live_ratio
    if not (raises or lowers):
        return None
    return KeptMove(previous.decision, previous.reason_code, previous.ratio, previous.ratio_lower,
                    previous.ratio_upper, previous.predicted_goodput_gain_ratio)


def _replay_contradicted(replay: ReplayCurve, summary: WorkloadSummary, settings: RecommenderSettings) -> bool:
    """The replay at the live ratio runs another batch than the server's (mean running requests off by more than
    the replay's calibration factor), while the server at that ratio showed neither pool failing: the replay
    pictured other traffic, and on what the server served no ratio does better than the live one. Whether the
    replay's own live point fails a pool does not matter: a picture that runs another batch puts its cliffs
    elsewhere too."""
    if replay.live_running_matches is not False:
        return False
    return (summary.state_pool_saturation_ratio is not None and summary.kv_blocked_ratio is not None
            and summary.state_pool_saturation_ratio < settings.served_failure_share
            and summary.kv_blocked_ratio < settings.served_failure_share
            and not summary.retractions_per_second)


def _reason(
    rec: Recommendation, summary: WorkloadSummary, serving: ServingConfig, constants: ByteConstants, context: float,
    r_center: float, bias: float, factor: float, spikiness: float, nudge: Nudge, restart_bar: float,
) -> str:
    """The human sentence for a decision already taken (tests read `reason_code`, people read this); `restart_bar`
    is the gain the decision was held to (`_gain_bar`'s)."""
    draft = effective_draft_tokens(serving)
    why = (
        f"L_eff {context:,.0f} tokens (request mean {summary.context_length_mean or 0:,.0f}), S={slots_per_request(serving)}"
        f"{', D=' + str(draft) if draft else ''}, token_equiv {constants.token_equiv:,.0f} -> r* {r_center:.3g}"
    )
    direction = "up" if factor > 1.0005 else ("down" if factor < 0.9995 else "none")
    if direction != "none":
        why += f"; biased {direction} x{factor:.2f} (spikiness {spikiness:.2f}{', closed loop' if nudge.log_factor else ''})"
    code = rec.reason_code
    if code.startswith("pin_"):
        return f"pin --max-mamba-cache-size {rec.recommended_max_mamba_cache_size}: {PIN_REASONS[code[4:]]}; {why}"
    if code == "pinned_as_recommended":
        return f"the live --max-mamba-cache-size {serving.max_mamba_cache_size} is within 10% of the recommended pin; {why}"
    if code == "live_ratio_unknown":
        return "live ratio unknown (pinned state pool without pool sizes); " + why
    if code == "inside_bounds":
        return f"live r {rec.live_ratio:.3g} is inside [{rec.ratio_lower:.3g}, {rec.ratio_upper:.3g}]; " + why
    if code == "gain_below_threshold":
        if rec.predicted_goodput_gain_ratio is not None:
            return (f"the replay predicts {(rec.predicted_goodput_gain_ratio - 1) * 100:+.1f}% goodput, below the "
                    f"{restart_bar:.1%} worth a restart; " + why)
        return f"predicted gain is below the {restart_bar:.0%} worth a restart; " + why
    live = rec.live_ratio or 0.0
    binds = f"the {rec.binding_pool_live} pool binds at the live r {live:.3g}" if rec.binding_pool_live else f"live r {live:.3g}"
    gain = rec.predicted_gain_ratio
    gain_text = f" (+{(gain - 1) * 100:.0f}% concurrency)" if gain else ""
    if rec.predicted_goodput_gain_ratio is not None:
        gain_text = f" ({(rec.predicted_goodput_gain_ratio - 1) * 100:+.1f}% replayed goodput)"
    return f"{binds}; r {rec.ratio:.3g}{gain_text}: {why}"
