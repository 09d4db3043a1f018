"""The what-if replay: the observed traffic through the scheduler model at candidate ratios."""

import math
from dataclasses import replace

import numpy as np
import pytest

from advisor.estimate.traffic import TrafficPicture
from advisor.recommend.replay import (
    CurvePoint,
    ReplayCurve,
    ReplaySettings,
    _run,
    calibrated_picture,
    recent_load,
    remembered_curve,
    replay_curve,
)
from advisor.scheduler.engine import simulate
from advisor.scheduler.types import RequestSpec
from advisor.sim.config import load_server_config
from advisor.sim.workload import workload_from_dict


def _template():
    """A replay result to dress as a stand-in's: its goodput figures are the stand-in's alone (no in-flight part)."""
    result = simulate(load_server_config("default").with_ratio(1.0), workload_from_dict(_chat(0.3)), duration=60.0)
    return replace(result, in_flight_tokens_per_second=0.0, in_flight_slo_tokens_per_second=0.0)

def _chat(rate: float) -> dict:
    return {
        "name": "chat",
        "arrival": {"process": "poisson", "rate": rate},
        "classes": [{"name": "chat", "input": {"median": 1500, "sigma": 0.6},
                     "output": {"median": 500, "sigma": 0.5, "max": 2048}, "max_new_tokens": {"fixed": 2048}}],
    }


def test_near_capacity_the_replay_leaves_the_state_bound_default_for_a_ratio_that_serves_more():
    server = load_server_config("default")
    workload = workload_from_dict(_chat(3.5))
    picture = TrafficPicture(workload.requests(4, 900), 900.0, "test")
    curve = replay_curve(server, picture, prior_ratio=3.0, live_ratio=0.5)
    assert curve is not None
    by_ratio = {p.ratio: p for p in curve.points}
    assert by_ratio[0.5].state_bound_fraction > 0.9  # the live split queues on its clamp
    assert curve.gain is not None and curve.gain > 1.05
    chosen = by_ratio[min(by_ratio, key=lambda r: abs(math.log(r / curve.chosen_ratio)))]
    assert curve.width_lower < curve.chosen_ratio < curve.width_upper
    assert chosen.raw_goodput >= max(p.raw_goodput for p in curve.points) * 0.98
    # the choice holds on traffic the replay did not see (another draw of the same process)
    unseen = workload.requests(5, 900)
    at = {r: simulate(server.with_ratio(r), workload, duration=900, warmup=90, arrivals=unseen).goodput_tokens_per_second
          for r in (0.5, curve.chosen_ratio)}
    assert at[curve.chosen_ratio] > at[0.5] * 1.05


def test_where_every_ratio_serves_the_traffic_the_plateaus_middle_decides_not_the_grid_end():
    """Underload: every candidate and the live ratio below them serve alike (and half a step below the live
    ratio, probed since nothing was tried near it). The choice is the plateau's geometric middle, near the prior
    the candidates are centred on, far from the lowest ratio tried."""
    server = load_server_config("default")
    workload = workload_from_dict(_chat(0.3))  # underload: every split serves everything at once
    picture = TrafficPicture(workload.requests(2, 900), 900.0, "test")
    prior = 4.0
    curve = replay_curve(server, picture, prior_ratio=prior, live_ratio=0.9)
    assert curve is not None and curve.flat
    assert curve.width_lower < 0.9 and curve.width_upper > 3 * prior
    assert curve.chosen_ratio == pytest.approx(math.sqrt(curve.width_lower * curve.width_upper))
    assert prior / 1.25 < curve.chosen_ratio <= prior
    assert curve.gain == pytest.approx(1.0, abs=0.02)


def test_too_few_requests_give_no_curve():
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(10)], 60.0, "test")
    assert replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9) is None


def _plateau_between(lower: float, upper: float):
    """A scheduler model stand-in whose goodput is flat from `lower` to `upper` and falls steeply outside."""
    from dataclasses import replace as dc_replace

    template = _template()

    def run_many(_server, _picture, ratios, _settings):
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=1000.0,
                           slo_goodput_tokens_per_second=1000.0 * (1.0 if lower <= r <= upper else 0.5))
                for r in ratios]
    return run_many


@pytest.mark.parametrize(
    ("lower", "upper", "prior", "chosen"),
    [
        # the candidates are 4/3, 2.31, 4, 6.93 and 12 (then just outside the plateau's ends): the plateau is
        # 4/3..4, and its middle is chosen, not the prior at its upper end nor a margin inside it
        (1.2, 4.5, 4.0, math.sqrt(4.0 / 3.0 * 4.0)),
        (3.9, 14.0, 4.0, math.sqrt(4.0 * 12.0)),  # the same from the other side
        (0.01, 100.0, 4.0, 4.0),  # flat over every candidate: the prior, on which they are centred
    ],
)
def test_on_a_plateau_the_middle_is_chosen_never_an_end(lower, upper, prior, chosen):
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    curve = replay_curve(server, picture, prior_ratio=prior, live_ratio=None, run_many=_plateau_between(lower, upper))
    assert curve is not None and curve.flat
    assert curve.chosen_ratio == pytest.approx(chosen)
    assert curve.width_lower < curve.chosen_ratio < curve.width_upper


def test_a_plateau_end_with_nothing_tried_near_it_is_probed_before_the_middle_is_taken():
    """The prior (8) sits far above a plateau of 1.4..3 and the live ratio 0.9 below it: the grid and its
    refinement find the plateau at 2.03..2.67, with nothing tried between 0.9 and 2.03. Half a step below, 1.54
    is still on it, and the middle moves from 2.33 to 2.03, next to the true plateau's (2.05)."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    curve = replay_curve(server, picture, prior_ratio=8.0, live_ratio=0.9, run_many=_plateau_between(1.4, 3.0))
    assert curve is not None and curve.flat
    half_step = 3.0 ** 0.25
    refined = 8.0 / 3.0 / half_step
    assert curve.width_lower == pytest.approx(refined / half_step)
    assert curve.width_upper == pytest.approx(8.0 / 3.0)
    true_middle = math.sqrt(1.4 * 3.0)
    assert abs(math.log(curve.chosen_ratio / true_middle)) < 0.02
    assert abs(math.log(math.sqrt(refined * 8.0 / 3.0) / true_middle)) > 0.1  # the middle of what the grid tried


def test_the_live_ratios_cliff_margin_is_measured_not_extrapolated_from_the_last_ratio_tried():
    """The live 0.9 is the lowest ratio tried and scores just under the plateau, and the curve halves below 0.75.
    Nothing else is tried below 0.9, so without a probe the worst score within the margin below it would be its
    own; the replay runs 0.9 / 1.4 and sees the cliff the live ratio sits next to."""
    from dataclasses import replace as dc_replace

    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    template = _template()

    def cliff_below(_server, _picture, ratios, _settings):
        def slo(r):
            return 1000.0 if r >= 1.0 else (990.0 if r >= 0.75 else 500.0)
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=slo(r),
                           slo_goodput_tokens_per_second=slo(r)) for r in ratios]

    curve = replay_curve(server, picture, prior_ratio=4.0, live_ratio=0.9, run_many=cliff_below)
    assert curve is not None
    assert min(p.ratio for p in curve.points) == pytest.approx(0.9 / ReplaySettings().cliff_keep_margin)
    assert curve.gain == pytest.approx(1000.0 / 990.0)  # on the observed traffic, next to nothing to gain
    assert curve.robust_gain is not None and curve.robust_gain > 1.3  # the cliff within the margin is seen


def _sharp_peak_beside_a_cliff(peak: float):
    """A stand-in whose goodput peaks sharply at `peak`, falling 6% per 1% of log r below it (a cliff) and 0.3% per
    1% above it."""
    from dataclasses import replace as dc_replace

    template = _template()

    def run_many(_server, _picture, ratios, _settings):
        def score(r):
            x = math.log(r / peak)
            return 1000.0 * max(0.0, 1.0 + 6.0 * x if x < 0 else 1.0 - 0.3 * x)
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=score(r),
                           slo_goodput_tokens_per_second=score(r)) for r in ratios]
    return run_many


def test_a_metrics_only_pictures_sharp_optimum_is_read_away_from_its_cliff():
    """A metrics-only picture places a curve only to within picture_spread in log r: of a sharp optimum at 2.0 with
    a cliff below it, the ratio is read where the expected score is best, above the peak, and the reported plateau
    takes it in. A request-log picture (the requests themselves), or a spread of 0, reads the peak itself."""
    server = load_server_config("default")
    requests = [RequestSpec(float(t), 100, 10, 100) for t in range(200)]

    def read(source: str, settings: ReplaySettings | None = None) -> ReplayCurve:
        curve = replay_curve(server, TrafficPicture(requests, 200.0, source), prior_ratio=2.0, live_ratio=None,
                             run_many=_sharp_peak_beside_a_cliff(2.0), settings=settings)
        assert curve is not None
        return curve

    exact, drawn = read("request_log"), read("metrics")
    assert exact.chosen_ratio == pytest.approx(2.0)
    assert drawn.chosen_ratio > 2.0 * 1.05
    assert drawn.width_lower <= drawn.chosen_ratio <= drawn.width_upper
    assert drawn.hold_lower < drawn.chosen_ratio < drawn.hold_upper
    assert read("metrics", ReplaySettings(picture_spread=0.0)).chosen_ratio == pytest.approx(2.0)
    # where the picture cannot tell a plateau's ratios apart anyway, its middle stands
    flat = replay_curve(server, TrafficPicture(requests, 200.0, "metrics"), prior_ratio=4.0, live_ratio=None,
                        run_many=_plateau_between(1.2, 4.5))
    assert flat is not None and flat.chosen_ratio == pytest.approx(math.sqrt(4.0 / 3.0 * 4.0))


# The replay without the plateau's lean on heavier traffic (`_leaned`): tests of the other heavier runs count theirs.
PLAIN = ReplaySettings(lean=False)


def _cliff_under_load(window: float, cliff: float, from_load: float = 1.0, *, low: float = 0.6,
                      high: float = math.inf, under_cliff: float = 500.0):
    """A stand-in whose goodput is flat from `low` up (to `high`; half outside) on the observed window, while on one
    more than `from_load` times heavier (a shorter window) it falls to `under_cliff` below `cliff`: a live ratio just
    above `low` only serves the draw it saw."""
    from dataclasses import replace as dc_replace

    template = _template()
    runs: list[tuple[float, float]] = []

    def run_many(_server, picture, ratios, _settings):
        runs.extend((picture.window_seconds, r) for r in ratios)
        heavier = picture.window_seconds < window / from_load

        def slo(r):
            if not low <= r <= high:
                return 500.0
            return under_cliff if heavier and r < cliff else 1000.0
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=slo(r),
                           slo_goodput_tokens_per_second=slo(r)) for r in ratios]
    return run_many, runs


def test_a_live_ratio_that_only_just_serves_the_observed_draw_is_replayed_on_heavier_traffic():
    """Holding looks free (the live 0.9 is on the plateau, 1.5x above its end), so the live and chosen ratios are
    replayed once more on the window 10% heavier, where everything under 1.2 halves: the live ratio loses there,
    and the hold band no longer holds it. Where the heavier traffic does not tell them apart, the band stands."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    settings = PLAIN
    run_many, runs = _cliff_under_load(200.0, 1.2)
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many, settings=PLAIN)
    assert curve is not None and curve.gain == pytest.approx(1.0)
    heavier = sorted(r for window, r in runs if window < 200.0)
    assert heavier == pytest.approx(sorted([0.9, curve.chosen_ratio]))  # two runs, on the window 1.1x heavier
    assert [window for window, _ in runs if window < 200.0] == pytest.approx([200.0 / settings.headroom] * 2)
    assert curve.headroom_gain == pytest.approx(2.0) and curve.headroom == settings.headroom
    assert curve.runs == len(curve.points) + 2
    run_many, _ = _cliff_under_load(200.0, 1.2)
    unloaded = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many,
                            settings=replace(PLAIN, headroom=1.0))
    assert unloaded is not None and unloaded.headroom_gain is None
    # the band moves up to halfway (in log r) between the live and the chosen ratio
    assert curve.hold_lower == pytest.approx(math.sqrt(0.9 * curve.chosen_ratio))
    assert curve.hold_lower > unloaded.hold_lower
    # a cliff under load that spares the live ratio too: the band stands as it was
    run_many, runs = _cliff_under_load(200.0, 0.85)
    calm = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many, settings=PLAIN)
    assert calm is not None and calm.headroom_gain == pytest.approx(1.0)
    assert calm.hold_lower == pytest.approx(unloaded.hold_lower)
    # a move worth a restart on the observed traffic already: no heavier replay
    run_many, runs = _cliff_under_load(200.0, 1.2)
    worth = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.5, run_many=run_many, settings=PLAIN)
    assert worth is not None and worth.gain is not None and worth.gain > 1.5
    assert worth.headroom_gain is None and all(window == 200.0 for window, _ in runs)


def test_a_live_ratio_with_no_room_to_spare_is_replayed_at_the_capacity_load():
    """The live 0.9 serves the window, and the window 10% heavier, as fully as the chosen ratio; only past 1.3x
    does everything under 1.2 halve (a split serving near its capacity: a burst the window did not hold builds a
    queue it drains slowly). Where the 1.1x pair ties, the pair runs once more at capacity_load: the live ratio
    loses there, the gain is reported at that load, and the hold band no longer holds it. capacity_load 1 runs
    no such pair, and a tie at the capacity load keeps the 1.1x figure."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    settings = PLAIN
    run_many, runs = _cliff_under_load(200.0, 1.2, from_load=1.3)
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many, settings=PLAIN)
    assert curve is not None and curve.gain == pytest.approx(1.0)
    loads = sorted({round(200.0 / window, 6) for window, _ in runs if window < 200.0})
    assert loads == pytest.approx([settings.headroom, settings.capacity_load])
    assert curve.headroom_gain == pytest.approx(2.0) and curve.headroom == settings.capacity_load
    assert curve.runs == len(runs) == len(curve.points) + 4
    assert curve.hold_lower == pytest.approx(math.sqrt(0.9 * curve.chosen_ratio))
    run_many, runs = _cliff_under_load(200.0, 1.2, from_load=1.3)
    off = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many,
                       settings=replace(PLAIN, capacity_load=1.0))
    assert off is not None and off.headroom_gain == pytest.approx(1.0) and off.headroom == settings.headroom
    assert all(window == pytest.approx(200.0 / settings.headroom) for window, _ in runs if window < 200.0)
    assert curve.hold_lower > off.hold_lower
    run_many, runs = _cliff_under_load(200.0, 0.85, from_load=1.3)  # the live ratio keeps its room
    calm = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many, settings=PLAIN)
    assert calm is not None and calm.headroom_gain == pytest.approx(1.0) and calm.headroom == settings.headroom
    assert calm.hold_lower == pytest.approx(off.hold_lower)
    with pytest.raises(ValueError, match="capacity_load"):
        ReplaySettings(capacity_load=0.5)


def test_a_wide_plateau_leans_toward_the_side_heavier_traffic_keeps():
    """The window's curve is flat over r 0.6-6; on the window 10% heavier everything under 2.5 loses 20%. The
    plateau's middle and the points halfway (in log r) to each end are replayed on that heavier window (three runs),
    and the choice leans to the upper one, inside the plateau, the hold band around it. Where the heavier window
    does not tell them apart, or the lean is off, the middle stands; a plateau too narrow to hold a move
    (its ends under min_move ** 4 apart) runs nothing more."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    settings = ReplaySettings()
    run_many, runs = _cliff_under_load(200.0, 2.5, high=6.0, under_cliff=800.0)
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None, run_many=run_many)
    assert curve is not None and curve.lean_from is not None and curve.lean_load == settings.headroom
    middle = math.sqrt(curve.width_lower * curve.width_upper)
    assert curve.lean_from == pytest.approx(middle)
    heavier = sorted(r for window, r in runs if window < 200.0)
    assert heavier == pytest.approx(sorted([math.sqrt(curve.width_lower * middle), middle,
                                            math.sqrt(middle * curve.width_upper)]))
    assert all(window == pytest.approx(200.0 / settings.headroom) for window, _ in runs if window < 200.0)
    assert curve.chosen_ratio == pytest.approx(math.sqrt(middle * curve.width_upper)) and curve.chosen_ratio > 2.5
    assert curve.lean_gain == pytest.approx(1000.0 / 800.0)
    assert curve.hold_lower < curve.chosen_ratio < curve.hold_upper <= curve.width_upper
    assert curve.runs == len(runs)
    assert ReplayCurve.from_dict(curve.to_dict()) == curve  # the checkpoint keeps the lean
    # a live ratio off the middle: the heavier pair ran the middle on the same heavier window, and the lean reuses
    # that run (two runs of its own)
    run_many, runs = _cliff_under_load(200.0, 2.5, high=6.0, under_cliff=800.0)
    paired = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many)
    assert paired is not None and paired.headroom_gain is not None and paired.lean_from is not None
    assert paired.headroom_chosen == pytest.approx((paired.lean_from, 800.0))
    at_lean_load = sorted(r for window, r in runs if window == pytest.approx(200.0 / settings.headroom))
    assert at_lean_load == pytest.approx(sorted([0.9, paired.lean_from, math.sqrt(paired.width_lower * paired.lean_from),
                                                 math.sqrt(paired.lean_from * paired.width_upper)]))
    assert paired.lean_gain == pytest.approx(1000.0 / 800.0) and paired.runs == len(runs)
    assert ReplayCurve.from_dict(paired.to_dict()) == paired
    # the heavier window does not tell them apart: the middle stands (the runs are still counted)
    run_many, runs = _cliff_under_load(200.0, 0.5, high=6.0, under_cliff=800.0)
    even = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None, run_many=run_many)
    assert even is not None and even.lean_from is None and even.lean_load == settings.headroom
    assert even.chosen_ratio == pytest.approx(math.sqrt(even.width_lower * even.width_upper))
    assert even.runs == len(runs) == len(even.points) + 3
    # off
    run_many, runs = _cliff_under_load(200.0, 2.5, high=6.0, under_cliff=800.0)
    off = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None, run_many=run_many, settings=PLAIN)
    assert off is not None and off.lean_load is None and all(window == 200.0 for window, _ in runs)
    assert off.chosen_ratio == pytest.approx(middle)
    # a plateau 1.4x wide: no move within it is worth a restart, and nothing more runs
    run_many, runs = _cliff_under_load(200.0, 2.0, low=1.7, high=2.4, under_cliff=800.0)
    narrow = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None, run_many=run_many)
    assert narrow is not None and narrow.width_ratio < settings.min_move ** 4
    assert narrow.lean_load is None and all(window == 200.0 for window, _ in runs)


def test_a_rising_rate_is_replayed_as_heavy_as_the_windows_last_minutes_came():
    """Arrivals at 1/s for 1500 s, then 1.4/s for the last 300 (the same requests): the rate rises, and the
    traffic to come is at least as heavy as the last minutes, not the window's mean. The heavier replay runs at
    their rate over the window's (~1.33x, not the 1.1x floor), capped at headroom_max. A window under three
    times trend_seconds, a steady one, a rise within the count's noise, or other traffic (a regime shift) keeps
    the floor."""
    server = load_server_config("default")
    steady = [RequestSpec(float(t), 100, 10, 100) for t in range(1500)]
    rising = steady + [RequestSpec(1500.0 + t / 1.4, 100, 10, 100) for t in range(420)]
    picture = TrafficPicture(rising, 1800.0, "test")
    expected = (420 / 300) / (len(rising) / 1800)
    assert recent_load(picture, 300.0) == pytest.approx(expected)
    assert recent_load(TrafficPicture(steady + [RequestSpec(1500.0 + t, 100, 10, 100) for t in range(300)], 1800.0,
                                      "test"), 300.0) == pytest.approx(1.0)
    assert recent_load(TrafficPicture(rising[:500], 800.0, "test"), 300.0) == 1.0  # too short to tell
    noisy = steady + [RequestSpec(1500.0 + t / 1.1, 100, 10, 100) for t in range(330)]
    assert recent_load(TrafficPicture(noisy, 1800.0, "test"), 300.0) == 1.0  # 330 against ~306: within its noise
    # as many more, but documents after chat: another traffic (a regime shift), not more of the same
    other = steady + [RequestSpec(1500.0 + t / 1.4, 30000, 500, 1000) for t in range(420)]
    assert recent_load(TrafficPicture(other, 1800.0, "test"), 300.0) == 1.0
    # a rise over by the window's middle: 0.2/s for 10 minutes (a new server's sessions building up), then 1.2/s
    early = [RequestSpec(t / 0.2, 100, 10, 100) for t in range(120)] + [RequestSpec(600.0 + t / 1.2, 100, 10, 100)
                                                                         for t in range(1440)]
    early_picture = TrafficPicture(early, 1800.0, "test")
    assert len([r for r in early if r.time >= 1500.0]) > 260 + 3 * 260 ** 0.5  # beyond the window's mean's noise
    assert recent_load(early_picture, 300.0) == 1.0
    # turns in runs (a conversation's): 6.7 Poisson deviations up over the last 5 minutes, within 3 of the runs' own
    rng = np.random.default_rng(7)
    runs = [RequestSpec(float(start) + 0.01 * i, 100, 10, 100) for start in range(0, 1800, 20)
            for i in range(int(rng.geometric(1 / (26 if start >= 1500 else 20))))]
    assert recent_load(TrafficPicture(runs, 1800.0, "test"), 300.0) == 1.0
    pair_only = ReplaySettings(follow_trend=False, lean=False)  # the trend's heavier pair alone, no curve of its own
    run_many, runs = _cliff_under_load(1800.0, 1.2)
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many, settings=pair_only)
    assert curve is not None and curve.headroom == pytest.approx(expected) and curve.trend_load is None
    assert [window for window, _ in runs if window < 1800.0] == pytest.approx([1800.0 / expected] * 2)
    run_many, runs = _cliff_under_load(1800.0, 1.2)
    capped = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many,
                          settings=replace(pair_only, headroom_max=1.2))
    assert capped is not None and capped.headroom == pytest.approx(1.2)


def test_a_rising_rate_reads_the_advice_where_the_heavier_traffic_holds_too():
    """The same rise: the window's curve is flat from 0.6 up, the traffic as heavy as its last minutes halves under
    1.2. The whole curve is replayed on that heavier traffic too, and the advice is read where both hold (above
    1.2), with the heavier traffic's plateau and load reported; the live 0.9 is off it, and moving gains there.
    Steady traffic replays the window alone."""
    server = load_server_config("default")
    steady = [RequestSpec(float(t), 100, 10, 100) for t in range(1500)]
    rising = steady + [RequestSpec(1500.0 + t / 1.4, 100, 10, 100) for t in range(420)]
    picture = TrafficPicture(rising, 1800.0, "test")
    load = recent_load(picture, 300.0)
    run_many, runs = _cliff_under_load(1800.0, 1.2)
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many)
    assert curve is not None and curve.trend_load == pytest.approx(load)
    ahead = [r for window, r in runs if window < 1800.0]
    assert all(window == pytest.approx(1800.0 / load) for window, _ in runs if window < 1800.0)
    assert len(ahead) >= 5 and 0.9 in ahead  # a curve of its own, the live ratio on it
    assert curve.window_plateau is not None and curve.window_plateau[0] < 0.9 < 1.2
    assert curve.trend_plateau is not None and curve.trend_plateau[0] >= 1.2 and curve.reads_both_plateaus
    assert 1.2 <= curve.width_lower <= curve.chosen_ratio and curve.hold_lower > 0.9
    assert curve.gain == pytest.approx(2.0)  # on the heavier traffic the live ratio halves
    assert curve.runs == len(runs)
    run_many, runs = _cliff_under_load(1800.0, 1.2)
    flat = replay_curve(server, TrafficPicture(steady + [RequestSpec(1500.0 + t, 100, 10, 100) for t in range(300)],
                                               1800.0, "test"), prior_ratio=2.0, live_ratio=0.9, run_many=run_many)
    assert flat is not None and flat.trend_load is None and flat.trend_plateau is None
    with pytest.raises(ValueError, match="headroom_max"):
        ReplaySettings(headroom=1.3, headroom_max=1.2)


def _queueing_under_load(window: float, knee: float):
    """A stand-in that queues nothing on the observed window and, on one `knee` times heavier or more, queues a
    share of its requests beyond the bound that grows with the load (a server at its capacity's edge); there its
    goodput halves below 1.2, while the observed window's is flat from 0.6 up."""
    from dataclasses import replace as dc_replace

    template = _template()
    runs: list[tuple[float, float]] = []

    def run_many(_server, picture, ratios, _settings):
        runs.extend((picture.window_seconds, r) for r in ratios)
        load = window / picture.window_seconds
        share = 0.0 if load < knee else min(1.0, 0.25 + 4.0 * (load - knee))

        def slo(r):
            return 500.0 if r < 0.6 or (load >= knee and r < 1.2) else 1000.0
        return [dc_replace(template, ratio=r, duration=picture.window_seconds, warmup=0.1 * picture.window_seconds,
                           completed_requests=1000, admitted_requests=1000, admitted_over_bound_requests=round(1000 * share),
                           goodput_tokens_per_second=slo(r), slo_goodput_tokens_per_second=slo(r)) for r in ratios]
    return run_many, runs


def _queue_histogram(over: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """SGLang's queue-time buckets around the 10 s bound, `over` of 1000 requests beyond it."""
    return (1.0, 5.0, 10.0, 20.0, math.inf), (600.0 * (1 - over), 400.0 * (1 - over), 0.0, 1000.0 * over, 0.0)


def test_a_server_that_queued_more_than_the_replay_is_replayed_heavier_until_it_queues_as_much():
    """The server's queue-time histogram shows a third of its requests waiting beyond the bound at the live 0.9,
    where the replay queues none: the replay is too light for this server. The window is made heavier until its
    replay at the live ratio queues as the server did (the share crosses a third just past 1.06x), and that load
    decides with the window as a trend's would: the advice moves above 1.2, where the heavier traffic holds. A
    server whose queue the replay matches, or one that queued less, keeps the window alone."""
    server = load_server_config("default")
    requests = [RequestSpec(float(t), 100, 10, 100) for t in range(1000)]
    picture = TrafficPicture(requests, 1000.0, "metrics", live_queue_times=_queue_histogram(1 / 3))
    run_many, runs = _queueing_under_load(1000.0, 1.06)
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many, settings=PLAIN)
    assert curve is not None
    assert curve.queue_shown == pytest.approx(1 / 3) and curve.queue_replayed == 0.0
    assert curve.queue_load is not None and 1.06 <= curve.queue_load <= 1.06 * 1.02  # bisected to within 2%
    # ... and no closer than the share's own noise tells: one standard deviation over the 1000 requests admitted
    assert abs(0.25 + 4.0 * (curve.queue_load - 1.06) - 1 / 3) <= math.sqrt((1 / 3) * (2 / 3) / 1000)
    assert curve.trend_load == pytest.approx(curve.queue_load)  # followed like a trend
    assert (curve.window_seconds, curve.requests) == (1000.0, 1000)  # the window replayed, not the heavier one's
    assert curve.reads_both_plateaus and curve.width_lower >= 1.2 and curve.chosen_ratio > 1.2
    assert curve.gain == pytest.approx(2.0)  # the live ratio halves on the traffic as heavy as the server's
    at_live = [window for window, r in runs if r == 0.9 and window < 1000.0]
    searched = set(at_live)  # the search's loads (the heavier curve's own runs one of them again)
    assert 2 <= len(searched) < ReplaySettings().queue_rounds and len(at_live) > len(searched)
    assert curve.runs == len(runs)
    for over in (0.0, 0.015):  # the server queued no more than the replay, or within the margin and its noise
        run_many, runs = _queueing_under_load(1000.0, 1.06)
        calm = replay_curve(server, replace(picture, live_queue_times=_queue_histogram(over)), prior_ratio=2.0,
                            live_ratio=0.9, run_many=run_many, settings=PLAIN)
        assert calm is not None and calm.queue_load is None and calm.trend_load is None
        assert all(window == 1000.0 or r in (0.9, calm.chosen_ratio) for window, r in runs)  # the heavier pair only
    run_many, _ = _queueing_under_load(1000.0, 1.06)
    off = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=run_many,
                       settings=replace(PLAIN, queue_rounds=0))
    assert off is not None and off.queue_load is None and off.queue_shown == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="queue_first_load"):
        ReplaySettings(queue_first_load=3.0, queue_load_max=2.0)


def _served(raw_of, slo_of, completed=5000):
    """A stand-in whose raw and SLO goodput at each ratio are given functions of r, `completed` requests each."""
    from dataclasses import replace as dc_replace

    template = _template()

    def run_many(_server, _picture, ratios, _settings):
        return [dc_replace(template, ratio=r, completed_requests=completed, goodput_tokens_per_second=raw_of(r),
                           slo_goodput_tokens_per_second=slo_of(r)) for r in ratios]
    return run_many


def test_slo_goodput_weighs_three_parts_in_four_and_under_sustained_overload_raw_goodput_decides():
    """Raw goodput peaks at 1.2 and SLO goodput at 3. Where the SLO figure is a real share of what is served, it
    decides (3/4 of the score); where no ratio meets the queue bound for more than a tenth of it, nor for as many
    requests as a curve needs, which requests happen to is noise and the replay scores what is served. A twentieth
    of 5,000 requests within the bound (a queue draining after a busy hour) is no noise: the SLO figure decides."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")

    def raw(r):
        return 1000.0 - 150.0 * abs(math.log(r / 1.2))

    def slo(scale):
        return lambda r: scale * (1000.0 - 300.0 * abs(math.log(r / 3.0)))

    served = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None, run_many=_served(raw, slo(0.9)))
    assert served is not None and served.metric == "goodput_score"
    assert abs(math.log(served.best_ratio / 3.0)) < abs(math.log(served.best_ratio / 1.2))
    point = served.points[0]
    assert point.goodput == pytest.approx(0.25 * point.raw_goodput + 0.75 * point.slo_goodput)
    overloaded = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None,
                              run_many=_served(raw, slo(0.05), completed=1000))  # 50 within the bound
    assert overloaded is not None and overloaded.metric == "raw_goodput"
    assert abs(math.log(overloaded.best_ratio / 1.2)) < 0.2
    assert all(p.goodput == p.raw_goodput for p in overloaded.points)
    # raw goodput flat (a draining queue serves the same tokens at every ratio), 250 requests within the bound
    draining = replay_curve(server, picture, prior_ratio=2.0, live_ratio=None,
                            run_many=_served(lambda r: 1000.0, slo(0.05)))
    assert draining is not None and draining.metric == "goodput_score"
    assert abs(math.log(draining.best_ratio / 3.0)) < 0.2


def test_a_sharp_optimum_is_bracketed_closer_than_the_grid():
    """A knife-edge curve (SLO goodput near a cliff on both sides, peak at 1.5) around a prior of 1.64: the grid
    and its refinement leave one best candidate; bracketing it at a quarter, then an eighth of the step lands
    within a few percent of the peak, where the grid alone stays on its candidate."""
    from dataclasses import replace as dc_replace

    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    template = _template()

    def knife_edge(_server, _picture, ratios, _settings):
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=1000.0,
                           slo_goodput_tokens_per_second=1000.0 * math.exp(-abs(math.log(r / 1.5)) / 0.08))
                for r in ratios]

    sharp = replay_curve(server, picture, prior_ratio=1.64, live_ratio=0.9, run_many=knife_edge)
    coarse = replay_curve(server, picture, prior_ratio=1.64, live_ratio=0.9, run_many=knife_edge,
                          settings=ReplaySettings(sharp_refinements=0))
    assert sharp is not None and coarse is not None
    assert abs(math.log(sharp.chosen_ratio / 1.5)) < 0.04
    assert coarse.chosen_ratio == pytest.approx(1.64)
    assert len(sharp.points) == len(coarse.points) + 4


def _documents_among_chat(seed: int, docs_talk_longer: bool) -> list[RequestSpec]:
    """Chat at 4 req/s with a burst of 30,000-token documents every two minutes; the documents' answers are four
    times the chat's, or drawn like them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for index in range(3600):
        t = index / 4.0
        doc = (t % 120.0) < 10.0 and index % 2 == 0
        output = int(rng.lognormal(math.log(1200 if doc and docs_talk_longer else 300), 0.5))
        out.append(RequestSpec(t, 30000 if doc else int(rng.integers(300, 1500)), max(1, output), 4096))
    return out


def test_the_replay_deals_the_outputs_again_until_its_running_batch_shows_what_the_server_showed():
    """The picture's outputs were drawn without their prompts (the documents answer like the chat); the server
    showed the longer running batch of documents that answer at length. The replay at the live ratio measures
    its own batch length, and the outputs are dealt out again until it comes within the tolerance."""
    import numpy as np

    server = load_server_config("default")
    truth = _documents_among_chat(1, docs_talk_longer=True)
    shown = _run(server, TrafficPicture(truth, 900.0, "truth"), 0.9, ReplaySettings()).mean_live_context
    rng = np.random.default_rng(2)
    drawn = [RequestSpec(r.time, r.input_tokens, int(o), r.max_new_tokens)
             for r, o in zip(truth, rng.permutation([r.output_tokens for r in truth]), strict=True)]
    picture = TrafficPicture(drawn, 900.0, "metrics", live_context=shown)
    settings = ReplaySettings()
    calibrated, result, calibration = calibrated_picture(server, picture, 0.9, settings)
    assert calibration is not None and calibration.rounds >= 1
    assert abs(calibration.replayed_before / shown - 1) > 0.1  # the drawn pairing was far off
    assert result.mean_live_context == pytest.approx(shown, rel=settings.calibration_tolerance)
    assert sorted(r.output_tokens for r in calibrated.requests) == sorted(r.output_tokens for r in drawn)
    docs = [r.output_tokens for r in calibrated.requests if r.input_tokens == 30000]
    chat = [r.output_tokens for r in calibrated.requests if r.input_tokens < 30000]
    assert np.mean(docs) > 2 * np.mean(chat)
    # the curve carries what was shown and what the replay showed; without a shown length, nothing moves
    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9)
    assert curve is not None and curve.live_context_shown == shown
    assert curve.live_context_replayed == pytest.approx(shown, rel=settings.calibration_tolerance)
    assert curve.live_running_matches is None  # the picture did not say how many ran
    unshown = TrafficPicture(drawn, 900.0, "metrics")
    same, _, none = calibrated_picture(server, unshown, 0.9, settings)
    assert none is None and same is unshown
    # a replay that runs another batch than the server's (here a fifth of its requests at once) is not re-paired
    crowded = replace(picture, live_running=5 * result.mean_busy_running_requests)
    kept, _, refused = calibrated_picture(server, crowded, 0.9, settings)
    assert refused is not None and refused.rounds == 0 and kept is crowded
    assert refused.running_matches(settings) is False
    matched = replace(picture, live_running=result.mean_busy_running_requests)
    assert calibrated_picture(server, matched, 0.9, settings)[2].rounds >= 1


def test_a_long_answer_finishing_on_either_side_of_the_windows_end_is_no_gain():
    """Above 5 one long answer happens to complete before the window ends, below it is still decoding: counted by
    what was decoded in the window, the curve is flat and the prior stands, where completed requests alone would
    have made the highest ratios 4% better."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    template = _template()

    def one_long_answer(_server, _picture, ratios, _settings):
        def done(r):
            return 1040.0 if r >= 5.0 else 1000.0
        return [replace(template, ratio=r, completed_requests=60, goodput_tokens_per_second=done(r),
                        slo_goodput_tokens_per_second=done(r), in_flight_tokens_per_second=1040.0 - done(r),
                        in_flight_slo_tokens_per_second=1040.0 - done(r)) for r in ratios]

    curve = replay_curve(server, picture, prior_ratio=2.0, live_ratio=0.9, run_many=one_long_answer)
    assert curve is not None and curve.flat
    assert curve.gain == pytest.approx(1.0)
    assert all(p.raw_goodput == pytest.approx(1040.0) for p in curve.points)
    assert 1.0 < curve.chosen_ratio < 5.0


def test_a_curve_survives_the_checkpoint_and_a_broken_one_is_refused():
    """`to_dict` / `from_dict` give the same curve back through JSON; a curve whose numbers are not (a NaN ratio,
    a goodput that is a bool, no points, a non-positive chosen ratio) is refused with ValueError."""
    import json

    point = CurvePoint(ratio=1.2, goodput=950.0, slo_goodput=900.0, raw_goodput=1100.0, max_running_requests=64,
                       kv_capacity_tokens=500_000, state_bound_fraction=0.1, kv_bound_fraction=0.0,
                       retracted_requests=0, queue_time_p90=2.5)
    curve = ReplayCurve(points=[point, replace(point, ratio=2.0, goodput=0.0)], chosen_ratio=1.2, best_ratio=1.2,
                        prior_ratio=1.5, width_lower=1.0, width_upper=1.6, flat=False, metric="goodput_score",
                        requests=800, window_seconds=1800.0, source="request_log", live_goodput=900.0,
                        chosen_goodput=950.0, step_time={"decode_base_seconds": 0.012}, hold_lower=0.9,
                        hold_upper=1.5, live_robust_goodput=None, chosen_robust_goodput=None)
    assert ReplayCurve.from_dict(json.loads(json.dumps(curve.to_dict()))) == curve
    saved = curve.to_dict()
    for broken in ({"points": [{**saved["points"][0], "ratio": float("nan")}]},
                   {"points": [{**saved["points"][0], "goodput": True}]},
                   {"points": []}, {"chosen_ratio": 0.0}):
        with pytest.raises(ValueError):
            ReplayCurve.from_dict({**saved, **broken})


def _chat_then_documents():
    """20 minutes of chat at 3/s, then 5 of documents at 1/s: the window's last regime began 300 s before its end."""
    chat = [RequestSpec(t / 3.0, 1400 + 200 * (t % 2), 300, 4096) for t in range(3600)]
    docs = [RequestSpec(1200.0 + t, 28000 + 4000 * (t % 2), 700, 8192) for t in range(300)]
    return TrafficPicture(chat + docs, 1500.0, "request_log")


def _plateau_by_load(window: tuple[float, float], ahead: tuple[float, float], runs: list | None = None):
    """A stand-in whose plateau is `window` on the 1800 s window and `ahead` on a heavier one (a shorter window)."""
    from dataclasses import replace as dc_replace

    template = _template()

    def run_many(_server, picture, ratios, _settings):
        if runs is not None:
            runs.extend(ratios)
        lower, upper = ahead if picture.window_seconds < 1800.0 else window
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=1000.0,
                           slo_goodput_tokens_per_second=1000.0 * (1.0 if lower <= r <= upper else 0.5))
                for r in ratios]
    return run_many


def test_where_no_ratio_holds_the_window_and_the_heavier_traffic_the_window_as_observed_decides():
    """A trend whose heavier traffic is on its plateau only over 3-6 while the window is over 0.3-1.5: the heavier
    traffic is a forecast, so the window's own curve decides, and both plateaus are reported."""
    server = load_server_config("default")
    steady = [RequestSpec(float(t), 100, 10, 100) for t in range(1500)]
    picture = TrafficPicture(steady + [RequestSpec(1500.0 + t / 1.4, 100, 10, 100) for t in range(420)], 1800.0,
                             "test")
    runs: list[float] = []
    curve = replay_curve(server, picture, prior_ratio=0.7, live_ratio=0.9,
                         run_many=_plateau_by_load(window=(0.3, 1.5), ahead=(3.0, 6.0), runs=runs))
    assert curve is not None and curve.trend_load is not None and not curve.reads_both_plateaus
    assert curve.trend_plateau is not None and curve.trend_plateau[0] >= 3.0
    assert curve.window_plateau == (curve.width_lower, curve.width_upper)
    assert 0.3 <= curve.width_lower < curve.chosen_ratio < curve.width_upper <= 1.5
    assert curve.runs == len(runs)


def _plateau_by_traffic(window: tuple[float, float], regime: tuple[float, float], runs: list | None = None,
                        slope: float | None = None):
    """A stand-in whose plateau is `regime` on a picture of documents alone and `window` on the mixed window (each
    ratio it runs appended to `runs`): off it the SLO score is halved, or with `slope` falls by that share per unit
    of log r away from the plateau."""
    from dataclasses import replace as dc_replace

    template = _template()

    def share(r: float, lower: float, upper: float) -> float:
        if lower <= r <= upper:
            return 1.0
        if slope is None:
            return 0.5
        return max(0.0, 1.0 - slope * math.log(lower / r if r < lower else r / upper))

    def run_many(_server, picture, ratios, _settings):
        if runs is not None:
            runs.extend(ratios)
        mean = sum(r.input_tokens for r in picture.requests) / len(picture.requests)
        lower, upper = regime if mean > 10000 else window
        return [dc_replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=1000.0,
                           slo_goodput_tokens_per_second=1000.0 * share(r, lower, upper))
                for r in ratios]
    return run_many


def test_after_a_regime_shift_the_advice_is_read_where_the_new_regime_and_the_window_are_both_on_their_plateaus():
    server = load_server_config("default")
    runs: list[float] = []
    curve = replay_curve(server, _chat_then_documents(), prior_ratio=1.0, live_ratio=0.9,
                         run_many=_plateau_by_traffic(window=(0.3, 3.0), regime=(0.1, 0.5), runs=runs))
    assert curve is not None
    assert curve.regime_seconds == pytest.approx(300.0) and curve.reads_both_plateaus
    assert curve.window_plateau is not None and curve.regime_plateau is not None
    assert 0.3 <= curve.window_plateau[0] < 0.5 < 2.0 < curve.window_plateau[1] <= 3.0  # tried ratios on each
    assert 0.1 <= curve.regime_plateau[0] < 0.3 < curve.regime_plateau[1] <= 0.5
    assert 0.3 <= curve.width_lower < curve.chosen_ratio < curve.width_upper <= 0.5
    # the live 0.9 serves the window but not the new regime: moving gains, and 0.9 is outside the hold band
    assert curve.gain == pytest.approx(2.0 / 1.25, rel=0.01)  # 3/4 SLO (half) + 1/4 raw (whole) at 0.9
    assert not curve.hold_lower <= 0.9 <= curve.hold_upper
    assert curve.runs == len(runs) > len(curve.points)  # every run counted once, the window's own replay too
    # the checkpoint keeps what the curve says of the regime
    restored = ReplayCurve.from_dict(curve.to_dict())
    assert restored.window_plateau == curve.window_plateau and restored.regime_seconds == curve.regime_seconds


def test_a_young_regime_is_drawn_again_to_the_window_and_an_older_one_repeated():
    """Documents alternating 28K and 32K prompts, one a second: 300 s of them from a request log (younger than
    `regime_redraw_seconds`, 600 s) are drawn again to fill the window, their order no longer the sample's own;
    700 s of them are repeated as they came, and so are 300 s of a metrics-only picture (already a draw of its
    intervals), and 300 s where the setting draws no regime again."""
    server = load_server_config("default")

    def regime_prompts(docs_seconds: int, source: str = "request_log",
                       settings: ReplaySettings | None = None) -> list[list[int]]:
        chat = [RequestSpec(t / 3.0, 1400 + 200 * (t % 2), 300, 4096) for t in range(3 * (1500 - docs_seconds))]
        docs = [RequestSpec(1500.0 - docs_seconds + t, 28000 + 4000 * (t % 2), 700, 8192)
                for t in range(docs_seconds)]
        seen: list[list[int]] = []
        inner = _plateau_by_traffic(window=(0.3, 3.0), regime=(0.1, 0.5))

        def run_many(server_, picture, ratios, settings):
            prompts = [r.input_tokens for r in picture.requests]
            if sum(prompts) / len(prompts) > 10000:
                seen.append(prompts)
            return inner(server_, picture, ratios, settings)
        curve = replay_curve(server, TrafficPicture(chat + docs, 1500.0, source), prior_ratio=1.0,
                             live_ratio=0.9, run_many=run_many, settings=settings)
        assert curve is not None and curve.regime_seconds == pytest.approx(docs_seconds, abs=60.0)
        assert seen
        return seen

    def alternates(prompts: list[int]) -> bool:
        return all(a != b for a, b in zip(prompts, prompts[1:], strict=False))

    young = regime_prompts(300)
    assert not any(alternates(prompts) for prompts in young)
    assert all(len(prompts) >= 1400 for prompts in young)  # drawn to the 1,500 s window, about one a second
    older = regime_prompts(700)
    assert all(alternates(prompts) and len(prompts) >= 1400 for prompts in older)
    from_metrics = regime_prompts(300, source="metrics")
    assert all(alternates(prompts) and len(prompts) >= 1400 for prompts in from_metrics)
    never = regime_prompts(300, settings=ReplaySettings(regime_redraw_seconds=0.0))
    assert all(alternates(prompts) and len(prompts) >= 1400 for prompts in never)
    always = regime_prompts(700, settings=ReplaySettings(regime_redraw_seconds=3600.0))
    assert not any(alternates(prompts) for prompts in always)
    with pytest.raises(ValueError):
        ReplaySettings(regime_redraw_seconds=-1.0)


def test_where_no_ratio_holds_both_the_advice_is_read_where_the_worse_of_the_two_is_best():
    """The new regime is on its plateau over 0.05-0.15, the window over 0.3-3.0, each falling off by 40% per unit
    of log r: the ratio is read between them, where neither loses more than the other, not at the new regime's
    best, where the traffic the window still remembers would fall off (a regime can end: held-out TP2's drift from
    chat to documents went back to chat, and the documents' ratio scored 3.9% of the best over the whole watch)."""
    server = load_server_config("default")
    runs: list[float] = []
    curve = replay_curve(server, _chat_then_documents(), prior_ratio=1.0, live_ratio=0.9,
                         run_many=_plateau_by_traffic(window=(0.3, 3.0), regime=(0.05, 0.15), runs=runs, slope=0.4))
    assert curve is not None and curve.regime_seconds == pytest.approx(300.0) and not curve.reads_both_plateaus
    assert curve.runs == len(runs)
    assert curve.regime_plateau is not None and curve.regime_plateau[1] <= 0.15
    assert curve.window_plateau is not None and curve.window_plateau[0] >= 0.3
    assert 0.15 < curve.chosen_ratio < 0.3
    # halfway in log r: neither side's share is much below the other's
    middle = math.sqrt(0.15 * 0.3)
    assert abs(math.log(curve.chosen_ratio / middle)) < 0.2


def test_without_regime_settings_the_window_alone_is_replayed():
    server = load_server_config("default")
    curve = replay_curve(server, _chat_then_documents(), prior_ratio=1.0, live_ratio=0.9,
                         settings=ReplaySettings(regime=None),
                         run_many=_plateau_by_traffic(window=(0.3, 3.0), regime=(0.1, 0.5)))
    assert curve is not None and curve.regime_seconds is None
    assert 0.3 <= curve.width_lower < 0.5 and 2.0 < curve.width_upper <= 3.0


def _draw_peaking_at(peak: float, *, source: str = "metrics", ratios=(1.0, 1.4, 1.7, 2.0, 2.4, 3.4), **fields):
    """A replay's curve whose score falls as the square of log(r / peak) (read as the replay reads it: the best ratio
    run, alone on its plateau)."""
    point = CurvePoint(ratio=1.0, goodput=0.0, slo_goodput=0.0, raw_goodput=0.0, max_running_requests=64,
                       kv_capacity_tokens=500_000, state_bound_fraction=0.0, kv_bound_fraction=0.0,
                       retracted_requests=0, queue_time_p90=1.0)
    points = [replace(point, ratio=r, goodput=1000.0 * (1.0 - math.log(r / peak) ** 2)) for r in ratios]
    best = max(points, key=lambda p: p.goodput).ratio
    return ReplayCurve(points=points, chosen_ratio=best, best_ratio=best, prior_ratio=1.7, width_lower=best,
                       width_upper=best, flat=False, metric="goodput_score", requests=2000, window_seconds=1800.0,
                       source=source, live_goodput=None, chosen_goodput=1000.0, step_time={}, hold_lower=best / 1.1,
                       hold_upper=best * 1.1, live_robust_goodput=None, chosen_robust_goodput=None, **fields)


def test_a_metrics_only_draw_is_read_with_the_last_replays_draw():
    """Two draws of one metrics-only window peak at 1.4 and 2.4 (a sharp optimum moves with the draw): the advice
    is read off their mean, whose peak is between them, on both draws' ratios; the draw's own points are kept (the
    next replay averages with them, not with this mean), and its runs are its own."""
    current = _draw_peaking_at(1.4, ratios=(1.0, 1.4, 2.0, 2.4, 3.4))
    previous = _draw_peaking_at(2.4, ratios=(1.0, 1.7, 2.4, 3.4))
    exact = ReplaySettings(picture_spread=0.0)  # the mean's own peak (the spread's reading is tested on its own)
    curve = remembered_curve(current, previous, live_ratio=0.9, settings=exact)
    assert curve.draws == 2 and curve.draw_points == current.points
    assert [p.ratio for p in curve.points] == [1.0, 1.4, 1.7, 2.0, 2.4, 3.4]
    # each ratio's score is the mean of the two shares: 1.7 was run by the previous draw only, 2.0 by this one only
    share_at = {r: 1.0 - math.log(r / 1.4) ** 2 for r in (1.7, 2.0)}
    before_at = {r: 1.0 - math.log(r / 2.4) ** 2 for r in (1.7, 2.0)}
    interpolated = {1.7: np.interp(math.log(1.7), [math.log(1.4), math.log(2.0)], [1.0, share_at[2.0]]),
                    2.0: np.interp(math.log(2.0), [math.log(1.7), math.log(2.4)], [before_at[1.7], 1.0])}
    assert curve.goodput_at(1.7) == pytest.approx(1000.0 * (interpolated[1.7] + before_at[1.7]) / 2)
    assert curve.goodput_at(2.0) == pytest.approx(1000.0 * (share_at[2.0] + interpolated[2.0]) / 2)
    assert current.chosen_ratio == 1.4 and 1.7 <= curve.chosen_ratio <= 2.0
    assert curve.live_goodput == pytest.approx(curve.goodput_at(0.9))
    assert curve.runs == current.runs == 5
    # the next replay averages its draw with this one's own, not with the mean
    again = remembered_curve(_draw_peaking_at(1.4, ratios=(1.0, 1.4, 2.0, 2.4, 3.4)), curve, live_ratio=0.9,
                             settings=exact)
    assert again.chosen_ratio == pytest.approx(1.4)


def test_only_plain_metrics_only_draws_are_averaged():
    """A request-log picture is the requests themselves (the last window is older traffic, no other draw); a curve
    read after a regime shift or under a trend is of other traffic than the last replay's; another metric is
    another score: each stands as it is."""
    previous = _draw_peaking_at(2.4)
    for current in (_draw_peaking_at(1.4, source="request_log"), _draw_peaking_at(1.4, regime_seconds=600.0),
                    _draw_peaking_at(1.4, trend_load=1.3), replace(_draw_peaking_at(1.4), metric="raw_goodput")):
        assert remembered_curve(current, previous, live_ratio=0.9, settings=ReplaySettings()) is current
    assert remembered_curve(_draw_peaking_at(1.4), None, live_ratio=0.9, settings=ReplaySettings()).draws == 1
    assert remembered_curve(_draw_peaking_at(1.4), _draw_peaking_at(2.4, regime_seconds=600.0), live_ratio=0.9,
                            settings=ReplaySettings()).chosen_ratio == pytest.approx(1.4)


def test_a_remembered_curve_survives_the_checkpoint_with_its_own_draw():
    import json

    curve = remembered_curve(_draw_peaking_at(1.4), _draw_peaking_at(2.4), live_ratio=0.9, settings=ReplaySettings())
    assert curve.draw_points is not None
    assert ReplayCurve.from_dict(json.loads(json.dumps(curve.to_dict()))) == curve


def test_the_replay_averages_a_metrics_only_picture_with_the_previous_draw():
    """Through `replay_curve`: the previous replay's draw, peaking elsewhere, moves the advice off this draw's peak."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "metrics")
    template = _template()

    def peaked(_server, _picture, ratios, _settings):
        return [replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=1000.0,
                        slo_goodput_tokens_per_second=1000.0 * (1.0 - math.log(r / 1.4) ** 2))
                for r in ratios]
    alone = replay_curve(server, picture, prior_ratio=1.7, live_ratio=None, run_many=peaked)
    assert alone is not None and alone.draws == 1 and alone.chosen_ratio < 1.5
    curve = replay_curve(server, picture, prior_ratio=1.7, live_ratio=None, run_many=peaked,
                         previous=_draw_peaking_at(2.4, ratios=(0.8, 1.2, 1.7, 2.4, 3.4)))
    assert curve is not None and curve.draws == 2
    assert curve.chosen_ratio > alone.chosen_ratio
    assert curve.draw_points == alone.points


@pytest.mark.parametrize(("dip", "bridged"), [(0.016, True), (0.04, False)])
def test_a_dip_within_twice_the_noise_between_two_best_stretches_is_part_of_the_plateau(dip, bridged):
    """The curve is best over 0.5-0.8 and over 1.6-2.5 with a dip between: a dip of 1.2% of the score (the SLO part
    is three in four) is within twice the 0.75% tolerance, noise in a thin window, and the plateau runs over both
    stretches; one of 3% is a real fall, and the plateau is the stretch the best was first found in."""
    server = load_server_config("default")
    picture = TrafficPicture([RequestSpec(float(t), 100, 10, 100) for t in range(200)], 200.0, "test")
    template = _template()

    def two_stretches(_server, _picture, ratios, _settings):
        def share(r):
            if 0.5 <= r <= 0.8 or 1.6 <= r <= 2.5:
                return 1.0
            return 1.0 - dip if 0.8 < r < 1.6 else 0.5
        return [replace(template, ratio=r, completed_requests=5000, goodput_tokens_per_second=1000.0,
                        slo_goodput_tokens_per_second=1000.0 * share(r)) for r in ratios]
    curve = replay_curve(server, picture, prior_ratio=1.2, live_ratio=None, run_many=two_stretches)
    assert curve is not None and curve.counts_tolerance == pytest.approx(0.0075)
    # the far stretch climbs back by the dip: within the dip allowance that is noise (twice it, at most twice the
    # counts' 0.75%), beyond it a second peak
    assert curve.plateau_tolerance == pytest.approx(0.015 if bridged else 0.0075)
    # read again (a metrics-only draw averaged with a previous draw of the same scores), it starts from the counts'
    # tolerance, not from the one the climb widened: the same tolerance and plateau, not the widening widened again
    draw = replace(curve, source="metrics")
    again = remembered_curve(draw, draw, live_ratio=None, settings=ReplaySettings())
    assert again.draws == 2 and again.plateau_tolerance == pytest.approx(curve.plateau_tolerance)
    assert (again.width_lower, again.width_upper) == (curve.width_lower, curve.width_upper)
    if bridged:
        assert 0.5 <= curve.width_lower <= 0.8 and 1.6 <= curve.width_upper <= 2.5
        assert 0.8 < curve.chosen_ratio < 1.6
    else:
        assert 0.5 <= curve.width_lower < curve.width_upper <= 0.8


@pytest.mark.parametrize(("far", "dip", "upper", "tolerance"), [
    (516.1, 512.6, 6.261, 2 * 3.5 / 521.1),  # climbs back 0.67% near the best: noise, the plateau runs to 6.26
    (511.0, 512.6, 2.087, 0.0075),  # falls on past its best: the plateau ends where it leaves the tolerance
    (521.0, 500.0, 2.087, 0.0075),  # climbs back 4%: a second peak, past the dip allowance
])
def test_a_curve_that_climbs_back_near_its_best_widens_its_plateau_by_that_noise(far, dip, upper, tolerance):
    """The last replay of a watched agent-sessions window (set 4's H100, seed 2): best at r 2.09, 1.2% lower at 2.75,
    1.6% at 3.6 and 1.0% at 6.3. A replay's curve rises to its best and falls past it, so the climb from 3.6 to 6.3
    is its own noise; within twice that the ratios are as good as it can tell, and the plateau runs over 1.2-6.3
    (its middle 2.75, past the server's cliff at 2.2, where 1.2-2.09 put it at 1.59)."""
    from advisor.recommend.replay import _plateau

    scores = {0.643: 353.4, 0.9: 508.6, 0.916: 508.2, 1.205: 517.2, 2.087: 521.1, 2.747: 514.8, 3.615: dip,
              6.261: far, 10.845: 267.6}
    best, plateau, found = _plateau(scores, lambda _: 0.0075)
    assert best == 2.087 and plateau[0] == 1.205 and plateau[-1] == upper
    assert found == pytest.approx(tolerance)


def test_a_metrics_only_pictures_outputs_are_scaled_until_its_replay_admits_at_the_servers_rate():
    """Heavy-tailed answers fill the default server's state pool at the live 0.9: there a request's slot is held for
    its output's steps, and the server admits at its slots' turnover. A picture whose outputs are 8% too long (the
    mean of a few hundred finishes of a heavy tail is that far off) admits slower; its outputs are scaled until its
    replay admits at the server's rate, and the scaled picture then queues as the watched traffic did. The same
    picture from a request log (exact lengths), or with the check off, is left as it is; so is one 40% too long,
    which no sampling error of the outputs' mean explains."""
    from advisor.recommend.replay import _admission_rate, _work_matched
    from advisor.sim.workload import load_workload

    server = load_server_config("default")
    settings = ReplaySettings()
    window = 900.0
    truth = load_workload("heavy-tail-outputs").requests(1, window)
    watched = _run(server, TrafficPicture(truth, window, "truth"), 0.9, settings)
    assert watched.state_bound_fraction > 0.5 and watched.kv_bound_fraction < watched.state_bound_fraction
    warm = watched.warmup
    series = ((0.0, warm, (60.0, 0.0)), (warm, window, (float(watched.admitted_requests), 0.0)))
    longer = [replace(r, output_tokens=round(r.output_tokens * 1.08)) for r in truth]
    picture = TrafficPicture(longer, window, "metrics", live_queue_times=((10.0, math.inf), (0.0, 0.0)),
                             live_queue_series=series)
    at_live = _run(server, picture, 0.9, settings)
    drawn_rate = _admission_rate(at_live)
    assert drawn_rate is not None and drawn_rate < _admission_rate(watched) * (1 - settings.work_tolerance)
    matched, result, work = _work_matched(server, picture, at_live, 0.9, settings,
                                          lambda s, p, rs, st: [_run(s, p, r, st) for r in rs])
    assert work is not None and work.scale is not None and 1 <= work.runs <= settings.work_rounds
    assert work.shown == pytest.approx(_admission_rate(watched))
    assert work.scale == pytest.approx(1 / 1.08, abs=0.03)
    assert _admission_rate(result) == pytest.approx(work.shown, rel=settings.work_tolerance)
    assert sum(r.output_tokens for r in matched.requests) == pytest.approx(sum(r.output_tokens for r in truth), rel=0.03)
    queued = {name: r.admitted_over_bound_requests / r.admitted_requests
              for name, r in (("watched", watched), ("drawn", at_live), ("matched", result))}
    assert abs(queued["matched"] - queued["watched"]) < abs(queued["drawn"] - queued["watched"]) / 2, queued
    # exact lengths, or the check off: left as drawn
    for source, rounds in (("request_log", 2), ("metrics", 0)):
        other = replace(picture, source=source)
        same, kept, none = _work_matched(server, other, at_live, 0.9, replace(settings, work_rounds=rounds),
                                         lambda *_: pytest.fail("no run expected"))
        assert same is other and kept is at_live and (none is None or none.scale is None)
    # a gap no sampling error of the mean explains (outputs 40% too long) says the picture is off in another way
    far = replace(picture, requests=[replace(r, output_tokens=round(r.output_tokens * 1.4)) for r in truth])
    far_live = _run(server, far, 0.9, settings)
    assert _admission_rate(far_live) < work.shown / settings.work_scale_max
    same, kept, unmatched = _work_matched(server, far, far_live, 0.9, settings,
                                          lambda *_: pytest.fail("no run expected"))
    assert same is far and kept is far_live and unmatched is not None and unmatched.scale is None
    # the curve reports what it matched
    curve = replay_curve(server, picture, prior_ratio=3.0, live_ratio=0.9, settings=settings)
    assert curve is not None and curve.work_scale == pytest.approx(work.scale)
    assert curve.admission_rate_shown == pytest.approx(work.shown)
    assert curve.admission_rate_replayed == pytest.approx(drawn_rate)


def test_a_kv_bound_replay_is_matched_to_the_servers_admissions_too():
    """Long answers fill the default server's KV pool at r 8 (its state pool never binds): a request holds its KV for
    its output's steps, so a KV-bound server too admits at the turnover its outputs set, and a picture whose outputs
    are 8% too long admits some 9% slower. Its outputs are scaled until its replay admits at the server's rate; a
    replay that neither pool held back (at r 3) admitted all that came, and its outputs are left as drawn."""
    from advisor.recommend.replay import _admission_rate, _work_matched
    from advisor.sim.workload import load_workload

    server = load_server_config("default")
    settings = ReplaySettings()
    window, live = 900.0, 8.0
    truth = load_workload("reasoning-long-output").requests(1, window)
    watched = _run(server, TrafficPicture(truth, window, "truth"), live, settings)
    assert watched.kv_bound_fraction > 0.2 and watched.state_bound_fraction == 0
    warm = watched.warmup
    series = ((0.0, warm, (60.0, 0.0)), (warm, window, (float(watched.admitted_requests), 0.0)))
    longer = [replace(r, output_tokens=round(r.output_tokens * 1.08)) for r in truth]
    picture = TrafficPicture(longer, window, "metrics", live_queue_times=((10.0, math.inf), (0.0, 0.0)),
                             live_queue_series=series)
    at_live = _run(server, picture, live, settings)
    assert _admission_rate(at_live) < _admission_rate(watched) * (1 - settings.work_tolerance)
    matched, result, work = _work_matched(server, picture, at_live, live, settings,
                                          lambda s, p, rs, st: [_run(s, p, r, st) for r in rs])
    assert work is not None and work.scale is not None and work.scale < 1
    assert abs(_admission_rate(result) / work.shown - 1) < abs(_admission_rate(at_live) / work.shown - 1) / 2
    assert sum(r.output_tokens for r in matched.requests) == pytest.approx(sum(r.output_tokens for r in truth), rel=0.04)
    # at r 3 neither pool holds this traffic back: the replay admitted what came, whatever its outputs
    light = _run(server, picture, 3.0, settings)
    assert light.kv_bound_fraction == 0 and light.state_bound_fraction == 0
    slower = replace(picture, live_queue_series=((0.0, warm, (60.0, 0.0)),
                                                 (warm, window, (float(light.admitted_requests) * 1.1, 0.0))))
    same, kept, unmatched = _work_matched(server, slower, light, 3.0, settings,
                                          lambda *_: pytest.fail("no run expected"))
    assert same is slower and kept is light and unmatched is not None and unmatched.scale is None


def test_a_new_regime_is_replayed_as_much_heavier_as_its_short_sample_leaves_its_rate_uncertain():
    """Five minutes of documents are 300 requests: their rate is known to 1/sqrt(300) (Poisson's; an even stream's
    counts disperse less, and count as Poisson's), and a stretch that short may hold none of the close arrivals the
    traffic to come will. The regime is replayed that much heavier, repeated to the window's length; with the
    setting off, as it came. Arrivals that come in runs (a minute at 2/s, a minute idle) disperse more, and weigh
    heavier."""
    from advisor.estimate.traffic import picture_since
    from advisor.recommend.replay import regime_load

    window = _chat_then_documents()
    docs = picture_since(window, 1200.0)
    assert regime_load(docs, 1.0) == pytest.approx(1.0 + 1.0 / math.sqrt(300))
    assert regime_load(docs, 0.0) == 1.0
    runs_of = [RequestSpec(float(minute * 60 + k / 2.0), 30000, 700, 8192) for minute in range(0, 10, 2)
               for k in range(120)]
    clumped = TrafficPicture(runs_of, 600.0, "request_log")
    assert regime_load(clumped, 1.0) > 1.0 + 2.0 / math.sqrt(len(runs_of))

    server = load_server_config("default")
    for sigmas, load in ((1.0, 1.0 + 1.0 / math.sqrt(300)), (0.0, 1.0)):
        seen: list[int] = []
        inner = _plateau_by_traffic(window=(0.3, 3.0), regime=(0.1, 0.5))

        def run_many(server_, picture, ratios, settings_, seen=seen, inner=inner):
            if sum(r.input_tokens for r in picture.requests) / len(picture.requests) > 10000:
                seen.append(len(picture.requests))
            return inner(server_, picture, ratios, settings_)
        curve = replay_curve(server, window, prior_ratio=1.0, live_ratio=0.9, run_many=run_many,
                             settings=ReplaySettings(regime_load_sigmas=sigmas))
        assert curve is not None and curve.regime_seconds == pytest.approx(300.0)
        assert seen and all(n == pytest.approx(1500 * load, abs=2) for n in seen)
