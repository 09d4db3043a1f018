"""The online recommender's required properties."""

import math
from dataclasses import replace

import pytest

from advisor.estimate.workload import EstimatorSettings, WorkloadEstimator
from advisor.model.pools import GIB, ByteConstants, optimal_ratio
from advisor.model.serving import ServingConfig
from advisor.recommend.engine import (
    OFF_PICTURE_BAR_FACTOR,
    RecommenderSettings,
    ServerModel,
    WorkloadPicture,
    recommend,
)
from advisor.recommend.types import Recommendation

CONSTANTS = ByteConstants(13.50 * GIB / 258, 15.03 * GIB / 1167553)
REST = 28.53 * GIB
EST = EstimatorSettings(window_min_requests=20, window_min_seconds=10)


def picture_of(est, now):
    return WorkloadPicture(est.summary(now), est.time_averaged_context(), est.confidence(now))


def run(lengths_per_phase, phases=1, seconds=2.0):
    est = WorkloadEstimator(EST)
    t = 0.0
    for _ in range(phases):
        for lengths in lengths_per_phase:
            for i in range(0, len(lengths), 10):
                est.observe_requests(t, lengths[i : i + 10])
                t += seconds
    return est, t


def model(**kwargs):
    return ServerModel(serving=ServingConfig(**kwargs), constants=CONSTANTS, rest_bytes=REST)


def test_point_mass_equals_seed_ratio():
    est, now = run([[(8192, 1024)] * 600])
    rec = recommend(model(strategy="extra_buffer_lazy"), picture_of(est, now), RecommenderSettings())
    seed = optimal_ratio(9216, CONSTANTS.token_equiv, slots=4)
    assert rec.ratio == pytest.approx(seed, rel=0.01)
    assert rec.decision == "raise_ratio"
    assert rec.reason_code == "state_pool_short"
    assert rec.bias == pytest.approx(0.0, abs=1e-9)  # no bias applied to a steady workload
    assert rec.binding_pool_live == "state" and rec.binding_pool_recommended == "balanced"
    assert rec.predicted_gain_ratio == pytest.approx(86 / 64, rel=0.02)  # clamp 64 -> 86 at S = 4


@pytest.mark.parametrize("state_bias", [RecommenderSettings().state_bias, 0.5, 2.0])
def test_alternating_regimes_at_least_time_averaged_l(state_bias):
    est, now = run([[(1500, 500)] * 300, [(30000, 2000)] * 300], phases=4)
    rec = recommend(model(), picture_of(est, now), RecommenderSettings(state_bias=state_bias))
    time_averaged = (2000 + 32000) / 2
    assert rec.ratio >= optimal_ratio(time_averaged, CONSTANTS.token_equiv, slots=5)
    assert rec.bias == pytest.approx(math.exp(state_bias * est.spikiness()) - 1.0, rel=1e-9)
    assert rec.bias > 0 and rec.nudge_evidence is None


def test_without_bias_alternating_regimes_sit_at_the_time_averaged_l():
    est, now = run([[(1500, 500)] * 300, [(30000, 2000)] * 300], phases=4)
    rec = recommend(model(), picture_of(est, now), RecommenderSettings(state_bias=0.0))
    # windows straddling a regime change mix the two (residence-weighted), so within 10%
    assert rec.ratio == pytest.approx(optimal_ratio((2000 + 32000) / 2, CONSTANTS.token_equiv, slots=5), rel=0.1)


def test_bias_knob_scales_with_spikiness():
    est, now = run([[(1500, 500)] * 300, [(30000, 2000)] * 300], phases=4)
    low = recommend(model(), picture_of(est, now), RecommenderSettings(state_bias=0.0))
    high = recommend(model(), picture_of(est, now), RecommenderSettings(state_bias=1.0))
    assert high.ratio / low.ratio == pytest.approx(math.exp(est.spikiness()), rel=1e-6)


def test_hold_inside_bounds_and_insufficient_data():
    est, now = run([[(8192, 1024)] * 600])
    seed = optimal_ratio(9216, CONSTANTS.token_equiv, slots=5)
    rec = recommend(model(mamba_full_memory_ratio=seed * 1.03), picture_of(est, now), RecommenderSettings())
    assert rec.decision == "hold"
    young, t = run([[(8192, 1024)] * 20])
    assert recommend(model(), picture_of(young, t), RecommenderSettings()).decision == "insufficient_data"


def test_long_context_pins_and_dcp_pins():
    est, now = run([[(190_000, 10_000)] * 300])
    rec = recommend(model(), picture_of(est, now), RecommenderSettings())
    assert rec.decision == "pin_state_pool"
    assert rec.recommended_max_mamba_cache_size % 5 == 0
    est2, now2 = run([[(8192, 1024)] * 300])
    assert recommend(model(dcp_size=8), picture_of(est2, now2), RecommenderSettings()).decision == "pin_state_pool"


def test_unified_memory_and_stale():
    est, now = run([[(8192, 1024)] * 300])
    assert recommend(model(unified_memory=True), picture_of(est, now), RecommenderSettings()).decision == "unified_memory"
    assert recommend(model(), picture_of(est, now), RecommenderSettings(), inputs_stale=True).decision == "inputs_stale"


def test_unified_memory_advises_on_the_cap():
    # mem_cache/unified_memory_pool.py ~1680-1691 / ~1829-1834: the byte split floats but the clamp is still
    # max_mamba_cache_size // S (kv_cache_configurator.py `resolve_max_num_reqs`), K sized by the ratio
    est, now = run([[(8192, 1024)] * 300])
    low = recommend(model(unified_memory=True, mamba_full_memory_ratio=0.05), picture_of(est, now), RecommenderSettings())
    assert low.decision == "unified_memory" and "raise the cap" in low.reason
    assert low.flag_line == f"--max-mamba-cache-size {low.recommended_max_mamba_cache_size}"
    assert low.recommended_max_mamba_cache_size // 5 > low.predicted_max_running_requests_live
    high = recommend(model(unified_memory=True, mamba_full_memory_ratio=5.0), picture_of(est, now), RecommenderSettings())
    assert high.decision == "unified_memory" and high.flag_line is None and "admits" in high.reason


def test_closed_loop_nudges_up_when_state_pool_saturates_unexpectedly():
    est, now = run([[(8192, 1024)] * 600])
    seed = optimal_ratio(9216, CONSTANTS.token_equiv, slots=5)
    picture = picture_of(est, now)
    plain = recommend(model(mamba_full_memory_ratio=seed), picture, RecommenderSettings())
    picture.summary.state_pool_saturation_ratio = 0.8
    nudged = recommend(model(mamba_full_memory_ratio=seed), picture, RecommenderSettings())
    assert nudged.ratio > plain.ratio
    assert nudged.nudge_evidence == "state_saturated" and plain.nudge_evidence is None


def test_the_bias_does_not_talk_the_gain_gate_into_holding():
    # spiky traffic where the biased target is past the mean-L balance: its own predicted gain is small,
    # but moving off the live ratio is worth it, so the decision must not be hold
    est, now = run([[(1500, 500)] * 300, [(30000, 2000)] * 300], phases=4)
    picture = picture_of(est, now)
    live = model(mamba_full_memory_ratio=0.5)
    plain = recommend(live, picture, RecommenderSettings(state_bias=0.0))
    biased = recommend(live, picture, RecommenderSettings(state_bias=1.0))
    assert biased.predicted_gain_ratio < 1.1  # the biased target alone looks not worth a restart
    assert plain.decision == "raise_ratio"
    assert biased.decision == "raise_ratio" and biased.reason_code == "state_pool_short", biased.reason
    assert biased.ratio > plain.ratio


def test_closed_loop_nudges_down_when_kv_blocks_against_the_model():
    est, now = run([[(8192, 1024)] * 600])
    picture = picture_of(est, now)
    plain = recommend(model(), picture, RecommenderSettings())
    assert plain.binding_pool_live == "state"
    picture.summary.kv_blocked_ratio = 0.8
    picture.summary.state_pool_saturation_ratio = 0.0
    nudged = recommend(model(), picture, RecommenderSettings())
    assert nudged.ratio == pytest.approx(plain.ratio * math.exp(-0.3))  # bounded at the 30% limit
    assert nudged.nudge_evidence == "kv_blocked"


def test_no_closed_loop_without_pool_sizes():
    est, now = run([[(8192, 1024)] * 600])
    picture = picture_of(est, now)
    picture.summary.state_pool_saturation_ratio = 0.9
    blind = ServerModel(serving=ServingConfig(), constants=CONSTANTS, rest_bytes=None)
    rec = recommend(blind, picture, RecommenderSettings())
    assert rec.ratio == pytest.approx(optimal_ratio(9216, CONSTANTS.token_equiv, slots=5), rel=0.01)
    assert rec.nudge_evidence is None and not any("nudged" in note for note in rec.notes)


def test_the_assumed_decode_lock_skip_is_said_and_a_configured_one_is_not():
    est, now = run([[(8192, 1024)] * 600])
    picture = picture_of(est, now)
    assumed = recommend(model(strategy="extra_buffer_lazy"), picture, RecommenderSettings())
    configured = ServerModel(serving=ServingConfig(strategy="extra_buffer_lazy").with_skip_decode_lock(False),
                             constants=CONSTANTS, rest_bytes=REST)
    told = recommend(configured, picture, RecommenderSettings())
    assert told.ratio == pytest.approx(assumed.ratio)  # same S: only what is said differs
    assert sum("SKIP_DECODE_LOCK" in note for note in assumed.notes) == 1
    assert not any("SKIP_DECODE_LOCK" in note for note in told.notes)
    skipping = ServerModel(serving=ServingConfig(strategy="extra_buffer_lazy").with_skip_decode_lock(True),
                           constants=CONSTANTS, rest_bytes=REST)
    assert recommend(skipping, picture, RecommenderSettings()).slots_per_request == assumed.slots_per_request - 1


def _curve(points, chosen, live, lower, upper, prior, margin=None):
    """A replayed curve; with `margin`, the hold band and the worst scores within it as the replay computes them."""
    from advisor.recommend.replay import CurvePoint, ReplayCurve, _interpolated

    made = [CurvePoint(ratio=r, goodput=g, slo_goodput=g, raw_goodput=g, max_running_requests=0, kv_capacity_tokens=0,
                       state_bound_fraction=0.0, kv_bound_fraction=0.0, retracted_requests=0, queue_time_p90=0.0)
            for r, g in points]
    goodput = dict(points)

    def robust(r, margin=1.25):  # within the replay's cliff margin (1.4: its keep margin)
        return min(_interpolated(goodput, x) for x in (r / margin, r, r * margin))

    hold = (min(lower * margin, chosen / 1.1), max(upper / margin, chosen * 1.1)) if margin else (lower, upper)
    return ReplayCurve(points=made, chosen_ratio=chosen, best_ratio=chosen, prior_ratio=prior, width_lower=lower,
                       width_upper=upper, flat=False, metric="raw_goodput", requests=1000, window_seconds=1800,
                       source="test", live_goodput=goodput[live], chosen_goodput=goodput[chosen],
                       step_time={"decode_base_seconds": 0.02}, hold_lower=hold[0], hold_upper=hold[1],
                       live_robust_goodput=robust(live) if margin else None,
                       chosen_robust_goodput=robust(chosen) if margin else None,
                       live_keep_robust_goodput=robust(live, 1.4) if margin else None,
                       chosen_keep_robust_goodput=robust(chosen, 1.4) if margin else None)


@pytest.mark.parametrize(
    ("points", "chosen", "decision", "code"),
    [
        # the replay's best is well below the closed form: lower r, whatever r* says
        ([(0.3, 900.0), (0.5, 1000.0), (0.9, 1200.0), (1.5, 1400.0), (3.0, 1100.0)], 1.5, "raise_ratio",
         "state_pool_short"),
        ([(0.3, 1300.0), (0.5, 1400.0), (0.9, 1200.0), (1.5, 1000.0), (3.0, 800.0)], 0.5, "lower_ratio", "kv_pool_short"),
        # a gain under min_goodput_gain is not worth a restart
        ([(0.3, 1000.0), (0.5, 1010.0), (0.9, 1000.0), (1.5, 990.0), (3.0, 900.0)], 0.5, "hold", "gain_below_threshold"),
    ],
)
def test_the_replayed_curve_decides_the_ratio_and_its_gain_the_decision(points, chosen, decision, code):
    est, now = run([[(8192, 1024)] * 600])
    picture = picture_of(est, now)
    picture.replay = _curve(points, chosen, live=0.9, lower=chosen / 1.1, upper=chosen * 1.1, prior=1.7)
    rec = recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture, RecommenderSettings())
    assert rec.ratio == pytest.approx(chosen)
    assert (rec.decision, rec.reason_code) == (decision, code)
    assert rec.predicted_goodput_gain_ratio == pytest.approx(dict(points)[chosen] / dict(points)[0.9])
    assert rec.goodput_curve == points
    assert rec.step_time_coefficients == {"decode_base_seconds": 0.02} and rec.replay_source == "test"


def _recommend_on(curve, est, now, previous: Recommendation | None = None) -> Recommendation:
    """The recommendation at the live 0.9 with `curve` as the replay (and `previous` as the last cycle's)."""
    picture = picture_of(est, now)
    picture.replay = curve
    return recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture, RecommenderSettings(),
                     previous=previous)


def _previous(decision: str | None) -> Recommendation | None:
    """The last cycle's recommendation as far as the hysteresis reads it: its decision."""
    return None if decision is None else Recommendation(decision=decision, reason="")


def test_an_advised_move_stands_until_its_replayed_gain_falls_below_a_share_of_the_bar():
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.3, 1000.0), (0.5, 1000.0), (0.9, 1000.0), (1.5, 1010.0), (3.0, 900.0)]  # +1% at 1.5
    settings = RecommenderSettings()
    assert settings.min_goodput_gain * settings.keep_gain_share < 0.01 < settings.min_goodput_gain

    def decide(previous):
        picture = picture_of(est, now)
        picture.replay = _curve(points, 1.5, live=0.9, lower=1.4, upper=1.6, prior=1.7)
        model_ = model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9)
        return recommend(model_, picture, settings, previous=_previous(previous)).decision

    assert decide(None) == "hold" and decide("hold") == "hold"
    assert decide("raise_ratio") == "raise_ratio"  # +1% is above a third of the bar: the advised raise stands
    assert decide("lower_ratio") == "hold"


def test_a_replay_whose_batch_is_not_the_servers_must_gain_twice_the_bar_to_move():
    """+2% at 1.5 moves a server whose replay ran the live ratio's batch as the server did, and holds one whose
    replay ran twice the server's batch there (its picture of the traffic is off): such a picture's next draw moved
    agent sessions on one GPU from a hold to a lower and back, on gains between the two bars."""
    from dataclasses import replace

    est, now = run([[(8192, 1024)] * 600])
    points = [(0.3, 1000.0), (0.5, 1000.0), (0.9, 1000.0), (1.5, 1020.0), (3.0, 900.0)]
    settings = RecommenderSettings()
    assert settings.min_goodput_gain < 0.02 < OFF_PICTURE_BAR_FACTOR * settings.min_goodput_gain
    curve = _curve(points, 1.5, live=0.9, lower=1.4, upper=1.6, prior=1.7)
    matched = _recommend_on(replace(curve, live_running_matches=True, live_running_shown=14.0,
                                    live_running_replayed=15.0), est, now)
    assert (matched.decision, matched.reason_code) == ("raise_ratio", "state_pool_short")
    off = _recommend_on(replace(curve, live_running_matches=False, live_running_shown=14.0,
                                live_running_replayed=28.0), est, now)
    assert (off.decision, off.reason_code) == ("hold", "gain_below_threshold")
    assert "+2.0% goodput, below the 3.0% worth a restart" in off.reason  # the bar it was held to
    assert any("picture of the traffic is off" in note for note in off.notes)
    # a raise advised before stands while its gain is above a third of the doubled bar
    kept = _recommend_on(replace(curve, live_running_matches=False, live_running_shown=14.0,
                                 live_running_replayed=28.0), est, now, _previous("raise_ratio"))
    assert kept.decision == "raise_ratio"


def test_a_live_ratio_next_to_a_cliff_moves_though_the_observed_traffic_did_not_fall_off_it():
    """The live r serves the observed traffic as well as the best, but a margin below it the replayed goodput
    collapses: the hold band is the plateau less the margin, and the worst case within it is worth the move."""
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.5, 600.0), (0.7, 900.0), (0.9, 1000.0), (1.5, 1000.0), (2.5, 1000.0), (4.0, 1000.0), (6.0, 990.0)]
    picture = picture_of(est, now)
    picture.replay = _curve(points, 2.5, live=0.9, lower=0.9, upper=6.0, prior=2.5, margin=1.5)
    rec = recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture, RecommenderSettings())
    assert rec.predicted_goodput_gain_ratio == pytest.approx(1.0)
    assert rec.ratio_lower == pytest.approx(1.35) and rec.ratio_upper == pytest.approx(4.0)
    assert (rec.decision, rec.reason_code) == ("raise_ratio", "state_pool_short")
    assert any("falls off" in note for note in rec.notes)
    # the same curve without the cliff below the live ratio: nothing to gain, hold
    flat = [(0.5, 1000.0)] + points[1:]
    flat[1] = (0.7, 1000.0)
    picture.replay = _curve(flat, 2.5, live=0.9, lower=0.5, upper=6.0, prior=2.5, margin=1.5)
    rec = recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture, RecommenderSettings())
    assert (rec.decision, rec.reason_code) == ("hold", "inside_bounds")


def test_a_move_advised_for_a_cliff_stands_while_the_cliff_stays_within_the_wider_keep_margin():
    """The cliff sits between 0.6 and 0.7, just past the margin below the live 0.9: a fresh look holds, but a
    raise already advised for it stands (the next replay's draw of the cliff would otherwise flip it back)."""
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.5, 600.0), (0.6, 700.0), (0.7, 1000.0), (0.9, 1000.0), (1.5, 1000.0), (2.5, 1000.0), (4.0, 1000.0)]

    def decide(previous):
        curve = _curve(points, 1.5, live=0.9, lower=0.7, upper=4.0, prior=1.5, margin=1.5)
        return _recommend_on(curve, est, now, _previous(previous)).decision

    assert decide(None) == "hold" and decide("hold") == "hold"
    assert decide("raise_ratio") == "raise_ratio"
    assert decide("lower_ratio") == "hold"


def test_a_live_ratio_that_loses_on_heavier_traffic_moves_though_the_observed_draw_spared_it():
    """The replayed curve is flat from 0.6 (the live 0.9 scores the best), but on the traffic 10% heavier the
    chosen 1.5 gains 6% over it: the move is worth a restart and says why; a 1% gain there is not."""
    from dataclasses import replace

    est, now = run([[(8192, 1024)] * 600])
    points = [(0.5, 600.0), (0.6, 1000.0), (0.9, 1000.0), (1.5, 1000.0), (2.5, 1000.0), (4.0, 990.0)]

    def decide(headroom_gain):
        curve = _curve(points, 1.5, live=0.9, lower=0.6, upper=4.0, prior=1.5, margin=1.5)
        return _recommend_on(replace(curve, hold_lower=1.2, headroom_gain=headroom_gain, headroom=1.1), est, now)

    moved = decide(1.06)
    assert (moved.decision, moved.reason_code) == ("raise_ratio", "state_pool_short")
    assert any("only just serves the observed traffic" in note and "+6.0%" in note for note in moved.notes)
    assert moved.predicted_goodput_gain_ratio == pytest.approx(1.0)  # on the observed traffic, as replayed
    small = decide(1.01)
    assert (small.decision, small.reason_code) == ("hold", "gain_below_threshold")
    # just past the 1.5% bar, but not by the replay's noise (its plateau tolerance, 0.75% here): two runs on
    # traffic nobody observed are no evidence of that
    edge = decide(1.02)
    assert (edge.decision, edge.reason_code) == ("hold", "gain_below_threshold")
    assert decide(1.025).decision == "raise_ratio"
    assert decide(None).decision == "hold"


def test_a_move_advised_before_stands_while_its_target_stays_on_the_replayed_plateau():
    """A raise to 1.5 was advised; this replay's plateau (0.6-2.0) holds the live 0.9 inside its band and its
    middle moved to 1.1. The raise stands, with its ratio and band, and its gain read off this curve; a target
    scoring more than twice the replay's noise under the best is dropped, and a hold before stays a hold."""
    est, now = run([[(8192, 1024)] * 600])
    # 1.5 scores 1% under the best: off this draw's plateau by its noise (0.75%), within twice it
    points = [(0.4, 700.0), (0.6, 1000.0), (0.9, 1000.0), (1.1, 1000.0), (1.5, 990.0), (2.0, 1000.0), (3.0, 800.0)]

    def decide(previous):
        return _recommend_on(_curve(points, 1.1, live=0.9, lower=0.6, upper=2.0, prior=1.1, margin=1.5), est, now,
                             previous)

    def raised_to(ratio):
        return Recommendation(decision="raise_ratio", reason="", reason_code="state_pool_short", ratio=ratio,
                              ratio_lower=ratio / 1.1, ratio_upper=ratio * 1.1, predicted_goodput_gain_ratio=1.04)

    assert (decide(None).decision, decide(None).reason_code) == ("hold", "inside_bounds")
    kept = decide(raised_to(1.5))
    assert (kept.decision, kept.reason_code) == ("raise_ratio", "state_pool_short")
    assert kept.ratio == pytest.approx(1.5) and (kept.ratio_lower, kept.ratio_upper) == pytest.approx((1.5 / 1.1, 1.65))
    assert kept.predicted_goodput_gain_ratio == pytest.approx(0.99)  # on this curve
    assert any("still within its noise of the best" in note for note in kept.notes)
    assert decide(raised_to(2.5)).decision == "hold"  # off the plateau now
    assert decide(Recommendation(decision="hold", reason="", ratio=1.5, ratio_lower=1.3,
                                 ratio_upper=1.7)).decision == "hold"


def test_while_the_replay_warms_up_the_advisor_waits_instead_of_deciding_on_the_prior():
    est, now = run([[(8192, 1024)] * 600])
    picture = picture_of(est, now)
    picture.replay_warming_up = (120.0, 300.0)
    rec = recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture, RecommenderSettings())
    assert (rec.decision, rec.reason_code) == ("insufficient_data", "not_enough_data")
    assert "300 s of observed traffic" in rec.reason and "120 s so far" in rec.reason
    picture.replay_warming_up = None  # without a replay pending, the closed form decides as before
    assert recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture,
                     RecommenderSettings()).decision != "insufficient_data"


def test_a_replay_the_server_contradicts_at_its_own_ratio_is_not_acted_on():
    """The replay's live point queues on the clamp with four times the server's batch, while the server, at that
    very ratio, served with neither pool failing: the replay pictured other traffic, and the live r stands.
    Where the replay runs the server's batch, or the server did queue on its clamp, the replay's move stands."""
    from dataclasses import replace

    est, now = run([[(8192, 1024)] * 600])
    points = [(0.3, 900.0), (0.5, 1000.0), (0.9, 1200.0), (1.5, 1400.0), (3.0, 1100.0)]

    def decide(matches, saturation, live_failure=0.6):
        picture = picture_of(est, now)
        picture.summary.state_pool_saturation_ratio = saturation
        picture.summary.kv_blocked_ratio = 0.0
        picture.summary.retractions_per_second = 0.0
        curve = _curve(points, 1.5, live=0.9, lower=1.4, upper=1.6, prior=1.7)
        queueing = [replace(p, state_bound_fraction=live_failure) if p.ratio == 0.9 else p for p in curve.points]
        picture.replay = replace(curve, points=queueing, live_running_shown=5.0, live_running_replayed=20.0,
                                 live_running_matches=matches)
        return recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9), picture,
                         RecommenderSettings())

    kept = decide(False, 0.0)
    assert (kept.decision, kept.reason_code) == ("hold", "inside_bounds")
    assert kept.ratio == pytest.approx(0.9) and kept.ratio_lower < 0.9 < kept.ratio_upper
    assert kept.predicted_goodput_gain_ratio == 1.0  # nothing is predicted to be gained by keeping the live r
    assert any("picture of the traffic is off" in note for note in kept.notes)
    assert decide(True, 0.0).decision == "raise_ratio"  # the replay runs the server's batch: trusted
    assert decide(None, 0.0).decision == "raise_ratio"  # nothing to check it by
    assert decide(False, 0.3).decision == "raise_ratio"  # the server did queue on its clamp
    # the replay's live point need not fail a pool itself: another batch puts its cliffs elsewhere too
    assert decide(False, 0.0, live_failure=0.05).decision == "hold"


def test_a_move_advised_before_stands_against_a_replay_the_server_contradicts():
    """A trusted replay advised raising r to 1.6; the next replay runs four times the server's batch at the live
    r, where the server served with neither pool failing. That picture says nothing against the advised move,
    so the move stands, its ratio, band and gain as advised; a hold before stays a hold, and a raise advised
    for a ratio the live one has since passed is not kept."""
    from dataclasses import replace

    est, now = run([[(8192, 1024)] * 600])
    points = [(0.3, 900.0), (0.5, 1000.0), (0.9, 1200.0), (1.5, 1400.0), (3.0, 1100.0)]

    def decide(previous, live=0.9):
        picture = picture_of(est, now)
        picture.summary.state_pool_saturation_ratio = 0.0
        picture.summary.kv_blocked_ratio = 0.0
        picture.summary.retractions_per_second = 0.0
        curve = _curve(points, 1.5, live=live, lower=1.4, upper=1.6, prior=1.7)
        picture.replay = replace(curve, live_running_shown=5.0, live_running_replayed=20.0, live_running_matches=False)
        return recommend(model(strategy="extra_buffer_lazy", mamba_full_memory_ratio=live), picture,
                         RecommenderSettings(), previous=previous)

    advised = Recommendation(decision="raise_ratio", reason="", reason_code="state_pool_short", ratio=1.6,
                             ratio_lower=1.45, ratio_upper=1.8, predicted_goodput_gain_ratio=1.12)
    kept = decide(advised)
    assert (kept.decision, kept.reason_code) == ("raise_ratio", "state_pool_short")
    assert (kept.ratio, kept.ratio_lower, kept.ratio_upper) == (1.6, 1.45, 1.8)
    assert kept.predicted_goodput_gain_ratio == 1.12
    assert kept.flag_line is not None and "1.6" in kept.flag_line
    assert any("advised before stands" in note for note in kept.notes)
    assert decide(kept).ratio == 1.6  # and the cycle after it, on the same replay
    assert decide(Recommendation(decision="hold", reason="", ratio=0.9, ratio_lower=0.8, ratio_upper=1.0)).decision == "hold"
    assert decide(None).decision == "hold"
    assert decide(advised, live=3.0).decision != "raise_ratio"  # the live r is past the advised one: nothing kept


def test_a_move_the_operator_applied_as_the_flag_line_rounds_it_is_not_kept_as_a_move_still_to_make():
    """The advice was to raise to 7.205; the server restarted at 7.2 has taken it, so a next replay that would hold
    is not overruled by the old move. A live ratio still well short of it keeps the move, and a lower stands the
    same way."""
    from advisor.recommend.engine import kept_move

    raised = Recommendation(decision="raise_ratio", reason="", reason_code="state_pool_short", ratio=7.205,
                            ratio_lower=6.6, ratio_upper=7.9)
    assert kept_move(raised, 7.2) is None
    kept = kept_move(raised, 0.9)
    assert kept is not None and kept.decision == "raise_ratio" and kept.ratio == 7.205
    lowered = Recommendation(decision="lower_ratio", reason="", reason_code="kv_pool_short", ratio=0.5,
                             ratio_lower=0.45, ratio_upper=0.55)
    assert kept_move(lowered, 0.52) is None
    assert kept_move(lowered, 0.9) is not None


def test_under_a_rising_rate_the_recommendation_says_which_plateaus_it_read_and_exports_the_load():
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.9, 1000.0), (1.2, 1200.0), (1.6, 1300.0), (2.4, 1280.0), (4.0, 900.0)]
    both = replace(_curve(points, 1.6, live=0.9, lower=1.4, upper=2.3, prior=1.7), trend_load=1.42,
                   window_plateau=(0.7, 3.0), trend_plateau=(1.3, 2.6))
    rec = _recommend_on(both, est, now)
    assert (rec.decision, rec.reason_code) == ("raise_ratio", "state_pool_short") and rec.replay_trend_load == 1.42
    assert any("came 1.42x as fast" in note and "read where both hold" in note for note in rec.notes)
    apart = replace(both, window_plateau=(0.5, 1.1))
    assert any("follows the window as observed" in note for note in _recommend_on(apart, est, now).notes)
    steady = _recommend_on(replace(both, trend_load=None, trend_plateau=None), est, now)
    assert steady.replay_trend_load is None and not any("rising" in note for note in steady.notes)


def test_a_choice_leaned_on_heavier_traffic_says_from_where_and_why():
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.9, 1000.0), (1.5, 1400.0), (2.5, 1410.0), (4.0, 1405.0), (6.0, 1000.0)]
    middle = replace(_curve(points, 2.5, live=0.9, lower=1.5, upper=4.0, prior=1.7), flat=True, lean_load=1.1)
    leaned = replace(middle, chosen_ratio=4.0, chosen_goodput=1405.0, lean_from=2.5, lean_gain=1.062)
    rec = _recommend_on(leaned, est, now)
    assert rec.ratio == pytest.approx(4.0) and rec.decision == "raise_ratio"
    assert any("1.1x heavier, r 4 scores +6.2% over its middle r 2.5" in note for note in rec.notes)
    plain = _recommend_on(middle, est, now)
    assert any("its middle, r 2.5, is furthest" in note for note in plain.notes)
    assert not any("heavier, r" in note for note in plain.notes)


def test_after_a_regime_shift_the_recommendation_says_which_plateaus_it_read():
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.3, 1300.0), (0.5, 1400.0), (0.9, 1200.0), (1.5, 1000.0), (3.0, 800.0)]
    both = replace(_curve(points, 0.5, live=0.9, lower=0.45, upper=0.55, prior=1.7), regime_seconds=420.0,
                   window_plateau=(0.4, 2.0), regime_plateau=(0.2, 0.6))
    rec = _recommend_on(both, est, now)
    assert (rec.decision, rec.reason_code) == ("lower_ratio", "kv_pool_short")
    assert any("changed character 7 min" in note and "read where both hold" in note for note in rec.notes)
    apart = replace(both, window_plateau=(0.8, 2.0))
    assert any("read where the worse of the two scores best" in note for note in _recommend_on(apart, est, now).notes)
    assert not any("changed character" in note for note in _recommend_on(replace(both, regime_seconds=None), est,
                                                                          now).notes)


def test_a_replay_whose_outputs_were_scaled_to_the_servers_admissions_says_so_and_exports_the_factor():
    est, now = run([[(8192, 1024)] * 600])
    points = [(0.9, 1000.0), (1.2, 1200.0), (1.6, 1300.0), (2.4, 1280.0), (4.0, 900.0)]
    scaled = replace(_curve(points, 1.6, live=0.9, lower=1.4, upper=2.3, prior=1.7), work_scale=0.97,
                     admission_rate_shown=1.01, admission_rate_replayed=0.98)
    rec = _recommend_on(scaled, est, now)
    assert (rec.replay_work_scale, rec.replay_admission_rate_shown, rec.replay_admission_rate_replayed) == (
        0.97, 1.01, 0.98)
    assert any("admitted 0.98 requests/s where the server admitted 1.01" in note and "scaled by 0.97" in note
               for note in rec.notes)
    matched = _recommend_on(replace(scaled, work_scale=None), est, now)
    assert matched.replay_work_scale is None and matched.replay_admission_rate_shown == 1.01
    assert not any("requests/s where the server admitted" in note for note in matched.notes)


@pytest.mark.parametrize("attn_dp", [1, 2])
def test_a_pin_read_off_the_replay_holds_whole_requests_worth_of_slots_on_every_dp_worker(attn_dp):
    """A DCP server is pinned (its ratio's split is fragile to the KV it shards); the pin holds the clamp of the
    ratio the replay chose. max_running_requests is max_mamba_cache_size // S per DP worker, so the chosen pool's
    remainder buys no concurrency: the pin is that clamp's slots exactly, and on every attention-DP worker."""
    from advisor.model.pools import split_pools
    from advisor.model.serving import slots_per_request

    est, now = run([[(8192, 1024)] * 300])
    points = [(0.9, 1000.0), (1.5, 1150.0), (2.45, 1300.0), (3.5, 1250.0), (5.0, 900.0)]
    picture = picture_of(est, now)
    picture.replay = _curve(points, 2.45, live=0.9, lower=2.2, upper=2.7, prior=2.45)
    server = model(dcp_size=8, dp_size=attn_dp, attn_dp_size=attn_dp, tp_size=8)
    rec = recommend(server, picture, RecommenderSettings())
    assert rec.decision == "pin_state_pool"
    slots = slots_per_request(server.serving)
    chosen = split_pools(server.rest_bytes, server.serving.with_ratio(rec.ratio), server.constants)
    per_worker = chosen.max_mamba_cache_size // slots * slots
    assert chosen.max_mamba_cache_size % slots != 0 or attn_dp > 1  # a remainder to drop (or workers to count)
    assert rec.recommended_max_mamba_cache_size == per_worker * server.serving.attn_dp_size
    pinned = split_pools(server.rest_bytes, replace(server.serving, max_mamba_cache_size=rec.recommended_max_mamba_cache_size),
                         server.constants)
    assert pinned.max_running_requests == chosen.max_running_requests  # the chosen clamp, no less
    assert pinned.kv_capacity_tokens >= chosen.kv_capacity_tokens  # and the remainder's bytes back in KV
