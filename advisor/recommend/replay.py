"""The what-if replay (pure): the observed traffic picture run through the scheduler model on this server's pools,
with its own fitted step times, at candidate ratios around the closed-form prior; the ratio is read off the
simulated goodput curve.

Each candidate is scored by SLO goodput (tokens/s of requests queued within a bound), three parts in four, and raw
goodput (output tokens/s served), one in four: a state-bound split pays for the queue it builds, a KV-bound one for
its retractions and requeues, and near capacity, where the SLO figure flips with the realisation of the arrivals,
the raw part keeps the score steady. Where the curve is flat within the replay's noise, the choice is the
plateau's geometric middle: the ratio furthest, in log r, from where the curve was seen to fall on either side
(or from the ends of what was tried), never the plateau's lowest or highest ratio; a dip of up to twice the noise
between two stretches on the plateau is noise too. A plateau end with nothing
tried within half a step outside it is probed half a step further first, so that the middle is not that of a
grid centred on a prior far off the plateau. The candidates are centred on the prior r*, so a curve flat over
all of them returns r* itself. The live ratio's worst score within the cliff margins is measured too, never
extrapolated: where the live ratio is the lowest or highest tried, the margin's end is run. The replayed window
is one realisation of the traffic, and the next one's plateau sits elsewhere within it (a short window holds
fewer of the bursts that end it): the middle is as far as the replay can see from both cliffs. For the same
reason, where holding the live ratio looks free, it and the chosen ratio run once more on the window's traffic
made heavier: a live ratio that only this draw spared loses there.

The live ratio runs first, as a check of the picture against the server: a metrics-only picture whose running
batch there is not as long as the server showed has its outputs paired again (`calibrated_picture`), and the
running requests it holds there are reported beside the server's. Its queue is checked too: where the server's
queue-time histogram shows more requests waiting beyond the bound than the replay there (`_queue_check`), the
window is replayed heavier until it queues as much, and that load is followed as a trend's is.

Where the traffic changed character inside the window (`advisor.estimate.regime`), the new regime is replayed on
its own too, as much heavier as its few minutes leave its rate uncertain (`regime_load`) and repeated to the
window's length, and the ratio read where both curves are on their plateaus (`regime_curve`). Where the same
traffic comes faster and faster (a morning's ramp: `recent_load`), the window is replayed again as heavy as its
last minutes came, and the ratio read where both hold (`trend_curve`): the traffic to come is heavier than the
window's mean. A metrics-only picture is one draw of what its histograms allow, and its
curve is read off the mean of this replay's draw and the last one's (`remembered_curve`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, NamedTuple

import numpy as np

from advisor.estimate.regime import RegimeSettings, regime_start
from advisor.estimate.traffic import (
    TrafficPicture,
    live_context,
    paired_to_live_context,
    picture_since,
    queue_share_over,
    redrawn,
    tiled,
)
from advisor.scheduler.engine import DEFAULT_QUEUE_TIME_BOUND, SimResult, simulate
from advisor.scheduler.server import SchedulerServerConfig
from advisor.scheduler.types import RequestSpec


@dataclass(frozen=True)
class ReplaySettings:
    queue_time_bound: float = DEFAULT_QUEUE_TIME_BOUND
    span: float = 3.0  # candidates from prior / span to prior * span
    points: int = 5  # on a geometric grid from prior / span to prior * span, then two refining points
    flat_tolerance: float = 0.0075  # a plateau is within this share of the best (plus the replay's own noise)
    # The hold band stays this factor inside the plateau's ends.
    edge_margin: float = 1.5
    # The hold band spans at least this factor either side of the chosen ratio: a smaller move is not a restart.
    min_move: float = 1.1
    # A restart for safety alone: the worst score within this factor of the live and the chosen ratios (a cliff
    # this close to the live ratio is worth moving away from; one further off is the plateau's business).
    cliff_margin: float = 1.25
    # A move already advised for a cliff stands while the cliff stays within this wider margin: where the cliff
    # sits near the margin's edge, each replay's draw of it would otherwise start and stop the advice in turn.
    cliff_keep_margin: float = 1.4
    # A sharp optimum (a plateau of one candidate) is bracketed again this many times, at half the step each
    # time: near a knife-edge a tenth off in r costs a tenth of the goodput.
    sharp_refinements: int = 2
    warmup_fraction: float = 0.1  # the replay starts empty: the first part of the window only fills it
    min_requests: int = 50
    # Where the picture's outputs were paired to the running batch's length the server showed, the replay at the
    # live ratio must show that length too, within this share; else the outputs are dealt out again towards it
    # (at most calibration_rounds times, each one more run at the live ratio).
    calibration_tolerance: float = 0.03
    calibration_rounds: int = 2
    # ... only while the replay at the live ratio runs the server's batch: its mean running requests within this
    # factor of the shown ones (a replay that queues where the server did not, or the other way round, holds
    # other requests in its batch, and their length says nothing of the pairing).
    calibration_running_factor: float = 1.3
    # The window is one draw of the traffic, and a live ratio that draw happened to spare can fall on the next,
    # whose peak holds a few more long prompts. Where holding looks free (the plain and cliff-robust gains under
    # headroom_below_gain: twice the recommender's restart bar, as a live ratio inside the hold band holds whatever
    # its gain), the live and chosen ratios are replayed once more on the window's traffic `headroom` times heavier
    # (its arrivals closer together by that factor): a live ratio that only just serves this draw loses there,
    # while a plateau wide enough to hold it does not.
    headroom: float = 1.1
    headroom_below_gain: float = 1.03
    # ... and at least as heavy as the window's last `trend_seconds` came (their arrival rate over the window's,
    # at most `headroom_max`), where that is a trend (`recent_load`: beyond the count's noise, the same traffic):
    # a rising rate (a morning's ramp) brings traffic heavier than the window's mean, and a live ratio the mean
    # spares can fail it. A window under three times `trend_seconds` shows no trend.
    trend_seconds: float = 300.0
    headroom_max: float = 1.5
    # ... and where that gain is small too, once more on the traffic `capacity_load` times heavier: a split that
    # serves the window only near its capacity serves it as fully as one with room to spare, the curve is flat
    # across both, and a queue that builds drains slowly at the first and at once at the second (held-out
    # reasoning waves on TP2: flat over r 0.19-1.71 on its watched half hour; a fresh hour cost the live 0.9 27% of
    # its goodput and the chosen 0.57 4%, where each of its halves alone served both fully; 1.5x heavier, the
    # watched half hour showed 0.9 at 88% of 0.57's). The load is the heaviest a trend is read at; 1 runs no such pair.
    capacity_load: float = 1.5
    # ... and within a plateau wide enough to hold a move (its ends min_move ** 4 apart), the points halfway (in log
    # r) from its middle to each end are replayed on the traffic `headroom` times heavier beside the middle: the
    # window is one draw, and the next, heavier in places, narrows the plateau from whichever side fails first (a
    # fuller state pool, or a fuller KV pool). Where one of them beats the middle there by more than twice the
    # plateau's tolerance, the choice leans to it (held-out support sessions on TP8, seed 2: the watched minutes
    # 0-25 replay flat over r 2.8-4.8, middle 3.7; 10% heavier they score 76% / 86% / 94% at 2.8 / 3.7 / 4.8, and the
    # whole half hour, its heavier last minutes too, serves 3.7 at 97.6% of its best and the leaned 4.2 at 100%).
    # False keeps the middle.
    lean: bool = True
    # ... and where that trend is there, the whole curve is replayed on the traffic that heavy too, and the ratio read
    # where both curves hold (`trend_curve`); False replays the trend's two runs only.
    follow_trend: bool = True
    # Where the traffic changed character inside the window (a regime shift), its new regime is replayed on its own
    # too and decides with the window (`replay_curve`); None replays the window alone.
    regime: RegimeSettings | None = RegimeSettings()
    # A new regime is a short sample, and a stretch of a few minutes may happen to hold none of the close arrivals the
    # traffic to come will: repeated to the window's length, its luck repeats too. Its replay is read as much heavier
    # as its rate is uncertain (this many standard errors of its count, Poisson's times its dispersion).
    regime_load_sigmas: float = 1.0
    # ... and from a request log, while younger than this, it is drawn again to the window's length instead of
    # repeated (`redrawn`). Held-out documents after chat on TP2 (seed 1), repeated from their first 4.4-6.8 minutes,
    # showed the live 0.9 within 1% of the best where the regime's 20 minutes lose 13% there, and the advice reached
    # the regime's good ratios 10.75 minutes after the shift. Drawn again at every age, it was on them 4.5 minutes
    # after, but a draw 15.7 minutes in read a plateau up to 0.59 and left them for a cycle (17.0 minutes in all).
    # Ten minutes is the shortest window the daemon replays at all (`replay_min_window_seconds`). A metrics-only
    # picture is a fresh draw of its intervals each replay already; drawn again on top, the held-out KDA regime
    # shift (seed 2) changed decision twice after the shift where it had not at all.
    regime_redraw_seconds: float = 600.0
    # A metrics-only picture (per-interval arrivals, bucketed lengths) places the curve's features only to within
    # this standard deviation in log r: redraws of one window put a sharp optimum's peak 7-12% either way. Where its
    # plateau is narrower than two of them, the ratio is read off the curve's expected score over that uncertainty
    # (`_spread_reading`), which leans away from the steeper side; 0 reads the plateau alone.
    picture_spread: float = 0.08
    # Where the server's queue-time histogram shows more of its requests waiting beyond the queue bound than the
    # replay at the live ratio does (by more than queue_margin and twice the share's sampling noise), the replay is
    # too light for this server (its arrivals burstier than a scrape's counts show, its steps slower than fitted):
    # the window is replayed heavier until it queues as the server did, at most queue_load_max times, in
    # queue_rounds runs at the live ratio (`_queue_check`), and that load is followed like a trend's
    # (`trend_curve`). The margin is one point: held-out batch-flood on one GPU queued 3.7% of its requests past the
    # bound against the replay's 1.0% (noise 1.2 points), where a hold at the live ratio cost 7% of goodput.
    queue_margin: float = 0.01
    queue_first_load: float = 1.25
    queue_load_max: float = 2.0
    queue_rounds: int = 6
    # A metrics-only picture draws each request's output from the histograms of the finishes, and a heavy tail's few
    # hundred finishes put the window's mean output some percent off. Where a pool is full that is its turnover (a
    # slot and a request's KV are held for its output's steps), so the queue and the ratio move with it. The server's
    # admission rate is shown (its queue-time histogram's count): where the replay at the live ratio admits at another
    # rate over its measured part, by more than work_tolerance, and a pool held it back, the picture's outputs are
    # scaled by replayed over shown rate, then by the secant, in up to work_rounds runs at the live ratio
    # (`_work_matched`). A gap that asks for more than work_scale_max either way is no sampling error of the outputs'
    # mean (heavy-tailed answers on TP8, seed 2: the picture's outputs summed 2.5-9.6% over the watched arrivals' from
    # one replay to the next): the picture is off in another way (agentic sessions' open-loop turns queue where the
    # server's closed loop did not, and a replay held back so admits slower), and its outputs are left as drawn.
    work_tolerance: float = 0.015
    work_scale_max: float = 1.2
    work_rounds: int = 2

    def __post_init__(self) -> None:
        if (not self.span > 1 or self.points < 3 or not 0 <= self.warmup_fraction < 1 or self.edge_margin < 1
                or self.min_move < 1 or self.cliff_margin < 1 or self.cliff_keep_margin < self.cliff_margin
                or self.sharp_refinements < 0 or not self.calibration_tolerance > 0 or self.calibration_rounds < 0
                or self.calibration_running_factor < 1 or self.headroom < 1 or self.headroom_max < self.headroom
                or not self.capacity_load >= 1
                or not self.trend_seconds > 0 or not 0 <= self.picture_spread < 1
                or not 0 <= self.queue_margin < 1 or not 1 <= self.queue_first_load <= self.queue_load_max
                or self.queue_rounds < 0 or not self.work_tolerance >= 0 or self.work_scale_max < 1
                or self.work_rounds < 0 or not self.regime_load_sigmas >= 0
                or not self.regime_redraw_seconds >= 0):
            raise ValueError("replay: span must be > 1, points >= 3, warmup_fraction in [0, 1), edge_margin, "
                             "min_move and cliff_margin >= 1, cliff_keep_margin >= cliff_margin, "
                             "sharp_refinements >= 0, calibration_tolerance > 0, calibration_rounds >= 0, "
                             "calibration_running_factor >= 1, headroom >= 1, headroom_max >= headroom, capacity_load >= 1, "
                             "trend_seconds > 0, picture_spread in [0, 1), queue_margin in [0, 1), "
                             "1 <= queue_first_load <= queue_load_max, queue_rounds >= 0, work_tolerance >= 0, "
                             "work_scale_max >= 1, work_rounds >= 0, regime_load_sigmas >= 0, "
                             "regime_redraw_seconds >= 0")


@dataclass(frozen=True)
class CurvePoint:
    ratio: float
    goodput: float  # the score: 3/4 SLO + 1/4 raw goodput, tokens/s
    slo_goodput: float
    raw_goodput: float
    max_running_requests: int
    kv_capacity_tokens: int
    state_bound_fraction: float
    kv_bound_fraction: float
    retracted_requests: int
    queue_time_p90: float


@dataclass(frozen=True)
class ReplayCurve:
    points: list[CurvePoint]  # by ratio
    chosen_ratio: float
    best_ratio: float
    prior_ratio: float
    width_lower: float  # the ratio range within flat_tolerance of the best
    width_upper: float
    flat: bool  # several candidates were equally good (the choice is their middle)
    # What `goodput` holds: "goodput_score" = 3/4 SLO + 1/4 raw goodput, or under sustained overload (no candidate
    # meets the queue bound) "raw_goodput".
    metric: str
    requests: int
    window_seconds: float
    source: str
    live_goodput: float | None  # at the live ratio, when given
    chosen_goodput: float
    step_time: dict[str, float]  # the cost model the replay stepped with (fitted to this server)
    # The hold band: the plateau less the edge margin at each end, and at least min_move either side of the
    # chosen ratio.
    hold_lower: float
    hold_upper: float
    # The worst score within the cliff margin of a ratio (the curve's value had the plateau's ends been that
    # much closer): a live ratio that serves well only because it sits just inside a cliff scores low here.
    live_robust_goodput: float | None
    chosen_robust_goodput: float | None
    # The same within the wider keep margin: what keeps a move advised for a cliff standing.
    live_keep_robust_goodput: float | None = None
    chosen_keep_robust_goodput: float | None = None
    # The running batch's mean sequence length: what the server showed, and what the replay at the live ratio
    # showed before and after the outputs were dealt out again towards it (None without the gauge).
    live_context_shown: float | None = None
    live_context_replayed_before: float | None = None
    live_context_replayed: float | None = None
    # The mean running requests while busy: the server's, and the replay's at the live ratio as built.
    live_running_shown: float | None = None
    live_running_replayed: float | None = None
    live_running_matches: bool | None = None  # within calibration_running_factor of each other
    calibration_rounds: int = 0  # re-pairings, each one more run at the live ratio
    # The share of the best score within which the plateau's ratios score: the counts' (flat_tolerance or the
    # replay's noise in requests), or the curve's own climb back near its best (`_plateau`), and the counts' alone, from
    # which a curve read again with other scores (`_reread`) starts.
    plateau_tolerance: float = 0.0075
    counts_tolerance: float = 0.0075
    # The chosen ratio's score over the live one's on the traffic `headroom` times heavier (None where not run: no
    # live ratio, one within min_move of the chosen, or a gain on the observed traffic already worth a restart).
    headroom_gain: float | None = None
    headroom: float = 1.0
    # ... and the chosen ratio's run on the traffic ReplaySettings.headroom times heavier, the lean's load (the ratio,
    # its score; None where the pair did not run that load), which the plateau's lean reuses for its middle.
    headroom_chosen: tuple[float, float] | None = None
    # After a regime shift inside the window: how long ago (seconds before the window's end) the new regime began,
    # the whole window's own plateau, and the runs no other field counts (the window's curve and heavier pair, the
    # new regime's heavier pair where the curve read from both drops it; the curve's points are the new regime's).
    regime_seconds: float | None = None
    window_plateau: tuple[float, float] | None = None
    regime_plateau: tuple[float, float] | None = None  # the new regime's own (the curve's is where both hold)
    other_runs: int = 0
    # Where the same traffic came faster over the window's last minutes (a trend): how much heavier it was replayed
    # (the curve's points are that traffic's), and that curve's own plateau.
    trend_load: float | None = None
    trend_plateau: tuple[float, float] | None = None
    # The share of requests that waited beyond the queue bound: the server's queue-time histogram's over the window
    # and the replay's at the live ratio (None without the histogram or a live ratio), and where the replay queued
    # less, how much heavier the window was replayed to queue as the server did (None: it matched).
    queue_shown: float | None = None
    queue_replayed: float | None = None
    queue_load: float | None = None
    # The server's admission rate over the replay's measured part (requests/s, from its queue-time histogram), the
    # replay's at the live ratio as the picture was drawn, and where they differed, the factor its outputs were
    # scaled by to match (`_work_matched`; None: not scaled).
    admission_rate_shown: float | None = None
    admission_rate_replayed: float | None = None
    work_scale: float | None = None
    # A metrics-only picture is one draw of the traffic the histograms allow: where `points` are this draw's scores
    # averaged with the previous replay's (`remembered_curve`), this replay's own, and how many draws `points` hold.
    draw_points: list[CurvePoint] | None = None
    draws: int = 1
    # Where the points halfway from the plateau's middle to its ends were replayed on heavier traffic (`_leaned`): how
    # much heavier, and where one of them beat the middle there, the middle the choice leaned from and the leaned ratio's score over it.
    lean_load: float | None = None
    lean_from: float | None = None
    lean_gain: float | None = None

    @property
    def reads_both_plateaus(self) -> bool:
        """After a regime shift or under a trend: some ratio is on both the other curve's plateau (the new regime's,
        the heavier traffic's) and the window's."""
        other = self.regime_plateau if self.regime_plateau is not None else self.trend_plateau
        return self.window_plateau is not None and other is not None and _overlap(self.window_plateau, other)

    def goodput_at(self, ratio: float) -> float:
        """The replayed score at `ratio`, linear in log r between the ratios run (the nearest end's beyond them)."""
        return _interpolated({point.ratio: point.goodput for point in self.points}, ratio)

    def gain_at(self, ratio: float) -> float | None:
        """The replayed score at `ratio` over the live ratio's (None without a live ratio)."""
        return _gain(self.goodput_at(ratio), self.live_goodput)

    @property
    def runs(self) -> int:
        """Runs of the scheduler model the replay took: its curve (this draw's points, where `points` average two), the
        re-pairings, the heavier traffic's two, and after a regime shift the whole window's (`other_runs`)."""
        own = self.draw_points if self.draw_points is not None else self.points
        return len(own) + self.calibration_rounds + (2 if self.headroom_gain is not None else 0) + self.other_runs

    @property
    def gain(self) -> float | None:
        """Predicted goodput at the chosen ratio over the live one."""
        return _gain(self.chosen_goodput, self.live_goodput)

    @property
    def robust_gain(self) -> float | None:
        """The chosen ratio's worst score within the margin over the live ratio's: the value of moving away from a
        cliff the live ratio sits next to, even where the observed traffic happened not to fall off it."""
        return _gain(self.chosen_robust_goodput, self.live_robust_goodput)

    @property
    def keep_robust_gain(self) -> float | None:
        """`robust_gain` within the keep margin: while it holds, an advised move away from a cliff stands."""
        return _gain(self.chosen_keep_robust_goodput, self.live_keep_robust_goodput)

    @property
    def width_ratio(self) -> float:
        return self.width_upper / self.width_lower if self.width_lower > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint: a restart reuses the curve until its replay is due again."""
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> ReplayCurve:
        """The curve `to_dict` wrote (ValueError, KeyError or TypeError on anything else)."""
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in saved.items() if name in known}
        points = [CurvePoint(**point) for point in values.pop("points")]
        if values.get("draw_points") is not None:
            values["draw_points"] = [CurvePoint(**point) for point in values["draw_points"]]
        for name in ("window_plateau", "regime_plateau", "trend_plateau", "headroom_chosen"):
            if values.get(name) is not None:
                low, high = values[name]
                values[name] = (float(low), float(high))
        curve = cls(points=points, **values)
        ratios = [curve.chosen_ratio, *(p.ratio for p in points)]
        if not points or not all(_finite_at_least(r, 0.0, above=True) for r in ratios) or not all(
                _finite_at_least(p.goodput, 0.0) for p in points):
            raise ValueError("a replay curve needs positive finite ratios and finite goodputs of at least 0")
        return curve


def _finite_at_least(value: object, low: float, *, above: bool = False) -> bool:
    """A finite number (not a bool) of at least `low` (above it, with `above`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > low if above else value >= low


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Two ratio ranges share a ratio."""
    return max(a[0], b[0]) <= min(a[1], b[1])


def _gain(chosen: float | None, live: float | None) -> float | None:
    """chosen / live, or None where either is unknown or the live score is not positive."""
    if chosen is None or live is None or live <= 0:
        return None
    return chosen / live


# The seed a young regime is drawn again under (`redrawn`): one draw, the same for the same picture.
REGIME_DRAW_SEED = 0


# The raw goodput's share of a candidate's score; the rest is SLO goodput.
RAW_GOODPUT_SHARE = 0.25


# Sustained overload: the best SLO goodput of the first candidates under this share of the best raw goodput, and
# under this many requests' worth. No split then meets the queue bound, and which requests happen to is noise: the
# candidates score raw goodput. A queue draining after a busy stretch (held-out evening-ramp-down on TP8: a twentieth
# of the raw goodput, hundreds of requests within the bound) is no noise: its raw goodput is flat over 1.4-4.2 while
# its SLO goodput triples from 1.4 to its peak at 2.87, where the timeline's is.
OVERLOAD_SLO_SHARE = 0.1
OVERLOAD_SLO_REQUESTS = 100


def _raw_goodput(result: SimResult) -> float:
    """Output tokens / s served in the replayed window: of the requests completed in it, and what those still in
    the system at its end had decoded. A long answer that ends just after the window's end counts what it decoded
    in it, so two close ratios do not differ by whether one long request finished in time."""
    return result.goodput_tokens_per_second + result.in_flight_tokens_per_second


def _slo_goodput(result: SimResult) -> float:
    """`_raw_goodput` of the requests queued within the bound."""
    return result.slo_goodput_tokens_per_second + result.in_flight_slo_tokens_per_second


def _score(result: SimResult, overloaded: bool = False) -> float:
    """SLO goodput, three parts in four, raw goodput one: what an operator is served is tokens within the queue
    bound, and a served token late still counts a little. Raw goodput alone is blind to the queue a short clamp
    builds under capacity; SLO goodput alone flips with the arrivals' realisation near capacity and is zero for
    every ratio under sustained overload (`overloaded`: raw goodput alone). With half raw, a plateau ran a
    cliff's width further than the SLO figure's (a 0.75% tolerance on the score is 1.5% of SLO goodput)."""
    if overloaded:
        return _raw_goodput(result)
    return RAW_GOODPUT_SHARE * _raw_goodput(result) + (1.0 - RAW_GOODPUT_SHARE) * _slo_goodput(result)


def _overloaded(results: Iterable[SimResult]) -> bool:
    """No candidate meets the queue bound for more than a sliver of what it serves (OVERLOAD_SLO_SHARE), nor for
    as many requests as a recommendation needs (OVERLOAD_SLO_REQUESTS; counted as the best SLO candidate's completed
    requests times its share of tokens within the bound)."""
    done = list(results)
    best_raw = max((_raw_goodput(r) for r in done), default=0.0)
    if not best_raw > 0:
        return False
    best = max(done, key=_slo_goodput)
    best_slo, raw = _slo_goodput(best), _raw_goodput(best)
    within = best.completed_requests * best_slo / raw if raw > 0 else 0.0
    return best_slo < OVERLOAD_SLO_SHARE * best_raw and within < OVERLOAD_SLO_REQUESTS


def run_ratios(server: SchedulerServerConfig, picture: TrafficPicture, ratios: Sequence[float],
               settings: ReplaySettings) -> list[SimResult]:
    """The replay at each of `ratios`, one after another (a `RunMany`; the daemon may spread them over processes)."""
    return [_run(server, picture, r, settings) for r in ratios]


RunMany = Callable[[SchedulerServerConfig, TrafficPicture, Sequence[float], ReplaySettings], list[SimResult]]


def _run(server: SchedulerServerConfig, picture: TrafficPicture, ratio: float, settings: ReplaySettings) -> SimResult:
    window = picture.window_seconds
    return simulate(
        server.with_ratio(ratio), _PictureSource(picture), duration=window, warmup=window * settings.warmup_fraction,
        arrivals=picture.requests, queue_time_bound=settings.queue_time_bound,
    )


@dataclass(frozen=True)
class _PictureSource:
    """A TrafficPicture seen as the scheduler model's traffic source (it only replays the given requests)."""

    picture: TrafficPicture

    @property
    def name(self) -> str:
        return f"observed ({self.picture.source})"

    def arrivals(self, rng: np.random.Generator, start: float, end: float) -> Iterator[RequestSpec]:
        return iter([r for r in self.picture.requests if start <= r.time < end])

    def requests(self, seed: int, duration: float) -> list[RequestSpec]:
        return [r for r in self.picture.requests if r.time < duration]


@dataclass(frozen=True)
class LiveCalibration:
    shown: float  # the server's mean running-batch length over the window (decode_sum_seq_lens / running)
    replayed_before: float  # the replay's at the live ratio, as the picture was built
    replayed: float  # ... after the re-pairing rounds (the best of them)
    rounds: int
    replayed_running: float  # the replay's mean running requests while busy at the live ratio, as built
    shown_running: float | None  # the server's

    def running_matches(self, settings: ReplaySettings) -> bool | None:
        if not self.shown_running:
            return None
        factor = settings.calibration_running_factor
        return self.shown_running / factor <= self.replayed_running <= self.shown_running * factor


@dataclass(frozen=True)
class WorkMatch:
    shown: float  # the server's admission rate over the replay's measured part, requests/s
    replayed: float  # the replay's at the live ratio, as the picture was drawn
    scale: float | None  # the factor the outputs were scaled by (None: they were left as drawn)
    runs: int  # the runs at the live ratio it added


def _shown_admission_rate(picture: TrafficPicture, start: float) -> float | None:
    """The server's admissions from `start` to the window's end (each interval's queue-time count, the part of it
    after `start` pro rata) over those seconds; None without the series or a span."""
    if picture.live_queue_series is None:
        return None
    count, seconds = 0.0, 0.0
    for begin, end, interval in picture.live_queue_series:
        inside = end - max(begin, start)
        if inside > 0 and end > begin:
            count += sum(interval) * inside / (end - begin)
            seconds += inside
    return count / seconds if seconds > 0 else None


def _admission_rate(result: SimResult) -> float | None:
    measured = result.duration - result.warmup
    return result.admitted_requests / measured if measured > 0 else None


def _scaled_outputs(picture: TrafficPicture, factor: float) -> TrafficPicture:
    fixed = set(picture.fixed_outputs)
    return replace(picture, requests=[
        r if index in fixed else replace(r, output_tokens=max(1, int(round(r.output_tokens * factor))))
        for index, r in enumerate(picture.requests)])


def _work_matched(server: SchedulerServerConfig, picture: TrafficPicture, at_live: SimResult, live_ratio: float,
                  settings: ReplaySettings, run_many: RunMany) -> tuple[TrafficPicture, SimResult, WorkMatch | None]:
    """The metrics-only picture whose replay at the live ratio admits requests at the rate the server did over
    the replay's measured part, with that replay's result. Where a pool is full, a request's slot and its KV are
    held for its prefill and its output's steps, so admissions are the pool's turnover and a picture whose outputs
    are some percent too long (the mean of a few hundred heavy-tailed finishes) admits that much slower and queues
    where the server did not; one too short the other way. The outputs are scaled by the replayed rate over the
    shown one, then by the secant through the two tries, while the rates differ by more than `work_tolerance` (the
    count is what the server did, not a sample of it: the watched timeline replayed admits at its rate exactly).
    Left as drawn where the gap asks for more than `work_scale_max` either way (no sampling error of the mean), or
    where the rates already agree: a replay neither pool held back admits what arrives, which the picture's
    arrivals match."""
    rate = _shown_admission_rate(picture, at_live.warmup)
    replayed = _admission_rate(at_live)
    if picture.source != "metrics" or rate is None or replayed is None or not rate > 0 or not replayed > 0:
        return picture, at_live, None
    tolerance = settings.work_tolerance

    def off(result_rate: float) -> float:
        return abs(result_rate / rate - 1.0)

    unchanged = WorkMatch(rate, replayed, None, 0)
    if (settings.work_rounds == 0 or off(replayed) <= tolerance
            or (replayed < rate and not (at_live.state_bound_fraction > 0 or at_live.kv_bound_fraction > 0))):
        # matched already, or it admitted all that came
        return picture, at_live, unchanged
    low, high = 1.0 / settings.work_scale_max, settings.work_scale_max
    if not low <= replayed / rate <= high:
        return picture, at_live, unchanged
    tried: list[tuple[float, float]] = [(1.0, replayed)]  # (scale, the replay's rate)
    best = (off(replayed), 1.0, picture, at_live)
    for _ in range(settings.work_rounds):
        scale, last = tried[-1]
        aim = scale * last / rate  # a slot's or KV's hold goes as the output: the rate as one over the scale
        if len(tried) > 1 and not math.isclose(tried[-2][1], last):
            slope = (scale - tried[-2][0]) / (last - tried[-2][1])
            secant = scale + (rate - last) * slope
            if slope < 0:
                aim = secant
        aim = min(max(aim, low), high)
        if any(math.isclose(aim, done) for done, _ in tried):
            break
        candidate = _scaled_outputs(picture, aim)
        result = run_many(server, candidate, [live_ratio], settings)[0]
        measured = _admission_rate(result)
        if measured is None or not measured > 0:
            break
        tried.append((aim, measured))
        if off(measured) < best[0]:
            best = (off(measured), aim, candidate, result)
        if off(measured) <= tolerance:
            break
    _, scale, matched, result = best
    return matched, result, WorkMatch(rate, replayed, scale if scale != 1.0 else None, len(tried) - 1)


def calibrated_picture(server: SchedulerServerConfig, picture: TrafficPicture, live_ratio: float,
                       settings: ReplaySettings, run_many: RunMany = run_ratios, at_live: SimResult | None = None,
                       ) -> tuple[TrafficPicture, SimResult, LiveCalibration | None]:
    """The picture whose replay at the live ratio shows the running batch's mean length the server showed, with
    that replay's result. The picture pairs outputs to the shown length by a step-weighted formula, but the
    gauge is sampled in time, and where step times swing with the batch (long prefills in bursts) the two part:
    the replay measures the gap, and the outputs are dealt out again towards the formula's value scaled by it.
    Without a shown length, the picture as it is (no calibration); the same where the replay's running batch is
    not the server's (its mean running requests off by more than `calibration_running_factor`)."""
    result = at_live if at_live is not None else run_many(server, picture, [live_ratio], settings)[0]
    shown = picture.live_context
    if shown is None or not shown > 0:
        return picture, result, None
    before = result.mean_live_context
    running = result.mean_busy_running_requests * max(1, server.serving.dp_size)
    unchanged = LiveCalibration(shown, before, before, 0, running, picture.live_running)
    if unchanged.running_matches(settings) is False:
        return picture, result, unchanged

    def off(replayed: float) -> float:
        return abs(replayed / shown - 1.0) if replayed > 0 else math.inf

    best = (picture, result)
    rounds = 0
    tried: list[tuple[float, float]] = []  # (the picture's step-weighted length, the replay's time-sampled one)
    for round_index in range(settings.calibration_rounds):
        replayed = result.mean_live_context
        step_weighted = live_context(picture.requests)
        if off(replayed) <= settings.calibration_tolerance or not step_weighted or not replayed > 0:
            break
        # the formula's value scaled by the gap; from the second round, the secant through the last two tries
        # (the gap itself moves as the long outputs move to the long prompts)
        aim = step_weighted * shown / replayed
        if tried and not math.isclose(tried[-1][1], replayed):
            slope = (step_weighted - tried[-1][0]) / (replayed - tried[-1][1])
            secant = step_weighted + (shown - replayed) * slope
            if slope > 0 and aim / 2 <= secant <= aim * 2:
                aim = secant
        tried.append((step_weighted, replayed))
        repaired = paired_to_live_context(list(picture.requests), aim,
                                          np.random.default_rng(round_index), keep=set(picture.fixed_outputs),
                                          tolerance=settings.calibration_tolerance / 3)
        if repaired == picture.requests:
            break  # no pairing of these outputs comes nearer
        picture = replace(picture, requests=repaired)
        result = run_many(server, picture, [live_ratio], settings)[0]
        rounds += 1
        if off(result.mean_live_context) < off(best[1].mean_live_context):
            best = (picture, result)
    picture, result = best
    return picture, result, LiveCalibration(shown, before, result.mean_live_context, rounds, running,
                                            picture.live_running)


def _interpolated(scores: dict[float, float], ratio: float) -> float:
    """The score at `ratio`, linear in log r between the candidates around it (the nearest end's beyond them)."""
    ratios = sorted(scores)
    return float(np.interp(math.log(ratio), [math.log(r) for r in ratios], [scores[r] for r in ratios]))


def _falling_beyond(scores: dict[float, float], ratio: float) -> float:
    """`_interpolated`, but beyond the candidates a curve falling toward its end goes on falling at the slope of its
    last two (in log r, down to 0), where the nearest end's score would say the ratios past it were never tried
    for nothing."""
    ratios = sorted(scores)
    if len(ratios) >= 2 and not ratios[0] <= ratio <= ratios[-1]:
        end, inner = (ratios[0], ratios[1]) if ratio < ratios[0] else (ratios[-1], ratios[-2])
        if scores[end] < scores[inner]:
            slope = (scores[inner] - scores[end]) / abs(math.log(inner / end))
            return max(0.0, scores[end] - slope * abs(math.log(ratio / end)))
    return _interpolated(scores, ratio)


def _open_ends(tried: list[float], plateau: list[float], half_step: float) -> list[float]:
    """Half a step outside each end of `plateau` (a run of `tried`, sorted) where nothing was tried that close."""
    low, high = tried.index(plateau[0]), tried.index(plateau[-1])
    slack = 1.01  # a refined point is half a step out, give or take rounding
    probes = []
    if low == 0 or plateau[0] / tried[low - 1] > half_step * slack:
        probes.append(plateau[0] / half_step)
    if high == len(tried) - 1 or tried[high + 1] / plateau[-1] > half_step * slack:
        probes.append(plateau[-1] * half_step)
    return probes


# A dip between two stretches within the tolerance of the best is noise while it stays within this many tolerances.
PLATEAU_DIP_TOLERANCES = 2.0

# A replay's goodput over r rises to its best on the state pool's side and falls past it on the KV pool's: a score that
# climbs back after falling, near the best, is the replay's own noise, and ratios within this many such climbs of the
# best are as good as it can tell, up to PLATEAU_DIP_TOLERANCES times the tolerance the replay's counts give. A
# climb back deeper than that dip allowance is a second peak, which the dip rule reads.
REBOUND_NOISE_FACTOR = 2.0


def _rebound_noise(scores: dict[float, float], tolerance: float) -> float:
    """The largest climb back, as a share of the best, of a score within PLATEAU_DIP_TOLERANCES `tolerance`s of the
    best over the lowest score between it and the best (0 for a curve that only rises to its best and falls past it).
    The tails are left out: a curve far down its cliff says nothing of how the ratios near the best rank."""
    ratios = sorted(scores)
    top = max(range(len(ratios)), key=lambda i: scores[ratios[i]])
    best = scores[ratios[top]]
    if not best > 0:
        return 0.0
    near = best * (1.0 - PLATEAU_DIP_TOLERANCES * tolerance)
    climb = 0.0
    for side in (ratios[top + 1:], ratios[:top][::-1]):
        lowest = best
        for ratio in side:
            lowest = min(lowest, scores[ratio])
            if scores[ratio] >= near:
                climb = max(climb, scores[ratio] - lowest)
    return climb / best


def _plateau(scores: dict[float, float], tolerance_of: Callable[[float], float]) -> tuple[float, list[float], float]:
    """(the best ratio, the contiguous run of ratios around it scoring within the tolerance of it, across dips of no
    more than PLATEAU_DIP_TOLERANCES tolerances between ratios that do, the tolerance). The tolerance is
    `tolerance_of(best)`, or REBOUND_NOISE_FACTOR times the curve's own climb back near the best where that is
    larger (`_rebound_noise`), at most PLATEAU_DIP_TOLERANCES times `tolerance_of(best)`; a climb back deeper than
    that is a second peak, and leaves the tolerance as it is. A thin window's curve wobbles by more than its
    tolerance: one of 141 requests scored 1.0 at r 0.094, 0.97 at 0.12-0.16 and 1.0 again at 0.28, and the plateau
    read as 0.08-0.11 alone turned the advice from a lowered ratio to a pin and back. Agent sessions whose prefixes
    the picture matched worse than the server scored 1.000 at r 2.09, 0.988 at 2.75, 0.984 at 3.6 and 0.990 again at
    6.3: the plateau read as 1.2-2.09 alone put the advice at 1.59, on the server's cliff (2.2)."""
    candidates = sorted(scores)
    best = max(candidates, key=lambda r: scores[r])
    base = tolerance_of(best)
    climb = _rebound_noise(scores, base)
    tolerance = (min(max(base, REBOUND_NOISE_FACTOR * climb), PLATEAU_DIP_TOLERANCES * base)
                 if climb <= PLATEAU_DIP_TOLERANCES * base else base)
    floor = scores[best] * (1.0 - tolerance)
    dip_floor = scores[best] * (1.0 - PLATEAU_DIP_TOLERANCES * tolerance)
    low = high = candidates.index(best)
    while low > 0 and scores[candidates[low - 1]] >= dip_floor:
        low -= 1
    while high < len(candidates) - 1 and scores[candidates[high + 1]] >= dip_floor:
        high += 1
    while scores[candidates[low]] < floor:  # the run's ends are within the tolerance itself
        low += 1
    while scores[candidates[high]] < floor:
        high -= 1
    return best, candidates[low:high + 1], tolerance


def _reading(plateau: Sequence[float], settings: ReplaySettings, *, spread_scores: dict[float, float] | None = None,
             tolerance: float = 0.0, chosen: float | None = None) -> tuple[float, float, float, tuple[float, float]]:
    """(the chosen ratio, the hold band's ends, the plateau's ends) read off a plateau: its geometric middle, the
    plateau less the edge margin at each end (at least min_move either side of the chosen ratio), and its ends.
    With `spread_scores` (a metrics-only picture's curve), a plateau narrower than two picture_spreads is read with
    `_spread_reading`: the middle of the expected curve's plateau, and the plateau's ends take that one's in too (a
    ratio as good in expectation is as good as the picture can tell). A `chosen` ratio given (a lean) replaces the
    middle."""
    low, high = plateau[0], plateau[-1]
    middle = math.sqrt(low * high)
    spread = settings.picture_spread
    if spread_scores is not None and spread > 0 and math.log(high / low) < 2 * spread:
        expected_low, expected_high = _spread_reading(spread_scores, spread, tolerance)
        middle = math.sqrt(expected_low * expected_high)
        low, high = min(low, expected_low), max(high, expected_high)
    chosen = chosen if chosen is not None else middle
    return (chosen, min(low * settings.edge_margin, chosen / settings.min_move),
            max(high / settings.edge_margin, chosen * settings.min_move), (low, high))


SPREAD_GRID_POINTS = 400


def _spread_reading(scores: dict[float, float], spread: float, tolerance: float) -> tuple[float, float]:
    """The ends of the plateau (within `tolerance` of its best) of the curve's expected score, where the curve's true
    place is uncertain by a normal `spread` in log r: the scores, linear in log r between the ratios run, smoothed
    by that kernel over the ratios run (about 2 ms). Of a sharp optimum beside a cliff this leans to the gentler
    side, where a picture that placed the peak a little off costs least."""
    ratios = sorted(scores)
    grid = np.linspace(math.log(ratios[0]), math.log(ratios[-1]), SPREAD_GRID_POINTS)
    values = np.interp(grid, [math.log(r) for r in ratios], [scores[r] for r in ratios])
    kernel = np.exp(-0.5 * ((grid[:, None] - grid[None, :]) / spread) ** 2)
    expected = kernel @ values / kernel.sum(axis=1)
    top = int(np.argmax(expected))
    floor = expected[top] * (1.0 - tolerance)
    low = high = top
    while low > 0 and expected[low - 1] >= floor:
        low -= 1
    while high < len(grid) - 1 and expected[high + 1] >= floor:
        high += 1
    return math.exp(grid[low]), math.exp(grid[high])


def _robust(scores: dict[float, float], ratio: float, margin: float) -> float:
    """The worst score within `margin` of `ratio` (interpolated between the ratios run)."""
    return min(_interpolated(scores, ratio / margin), _interpolated(scores, ratio),
               _interpolated(scores, ratio * margin))


def replay_curve(
    server: SchedulerServerConfig,
    picture: TrafficPicture,
    *,
    prior_ratio: float,
    live_ratio: float | None,
    settings: ReplaySettings | None = None,
    run_many: RunMany = run_ratios,
    previous: ReplayCurve | None = None,
) -> ReplayCurve | None:
    """The goodput curve of the observed traffic over candidate ratios and the ratio it picks; None when the
    picture is too thin to replay. `run_many` runs a batch of candidates (the grid and the live ratio, then the
    refinement), in this process by default. `previous` is the last replay of the same server and traffic, whose
    draw a metrics-only picture's curve is averaged with (`remembered_curve`).

    Where the traffic changed character inside the window (`regime_start`), the new regime is replayed on its own
    too, and decides: the ratio is read where both curves are on their plateaus (each score as a share of its
    curve's best, the smaller of the two), so the advice follows the new traffic at once without giving up what
    the window still remembers; where no ratio is on both plateaus, where the smaller share is best."""
    settings = settings or ReplaySettings()
    whole, calibrated, load = _window_curve(server, picture, prior_ratio=prior_ratio, live_ratio=live_ratio,
                                            settings=settings, run_many=run_many)
    if whole is None:
        return None
    start = (regime_start(calibrated.requests, calibrated.window_seconds, settings.regime)
             if settings.regime is not None else None)
    if start is None:
        followed = _followed_trend(server, whole, calibrated, load, prior_ratio=prior_ratio, live_ratio=live_ratio,
                                   settings=settings, run_many=run_many)
        remembered = remembered_curve(followed, previous, live_ratio=live_ratio, settings=settings)
        return _leaned(server, calibrated, remembered, live_ratio=live_ratio, settings=settings, run_many=run_many)
    # The new regime's picture, repeated to the window's length: what the window would have been had the new traffic
    # filled it (a queue or a KV pool that fills over many minutes shows in a replay that long, not in one of the
    # regime's first minutes from empty). From a request log and younger than `regime_redraw_seconds`, it is drawn
    # again instead: repeated, a few minutes' luck repeats too (`redrawn`). The server's running batch over the
    # window says nothing of its part, so it is not paired again (the window's pairing stands).
    regime_seconds = calibrated.window_seconds - start
    since = picture_since(calibrated, start)
    since = heavier(since, regime_load(since, settings.regime_load_sigmas))
    filled = (redrawn(since, calibrated.window_seconds, np.random.default_rng(REGIME_DRAW_SEED))
              if calibrated.source == "request_log" and regime_seconds < settings.regime_redraw_seconds
              else tiled(since, calibrated.window_seconds))
    recent = replace(filled,
                     live_context=None, live_running=None, live_queue_times=None, live_queue_series=None)
    scale = _mean_size(calibrated.requests) / _mean_size(recent.requests)  # r* goes as 1 / L
    own, _, _ = _window_curve(server, recent, prior_ratio=prior_ratio * scale, live_ratio=live_ratio,
                              settings=settings, run_many=run_many,
                              also=(whole.width_lower, whole.chosen_ratio, whole.width_upper))
    if own is None:
        return whole
    return regime_curve(whole, own, regime_seconds=regime_seconds, live_ratio=live_ratio,
                        settings=settings)


def _leaned(server: SchedulerServerConfig, picture: TrafficPicture, curve: ReplayCurve, *, live_ratio: float | None,
            settings: ReplaySettings, run_many: RunMany) -> ReplayCurve:
    """`curve`, its choice leaned toward the point halfway (in log r) from its plateau's middle to an end that the
    window `headroom` times heavier serves best, where that beats the middle there by more than twice the plateau's
    tolerance. Three runs (two where the heavier pair ran the middle at that load), on a plain curve whose plateau
    ends lie min_move ** 4 apart or more (a curve read after a regime shift or under a trend has been read with other
    traffic already)."""
    if (not settings.lean or curve.trend_load is not None or curve.regime_seconds is not None or not curve.flat
            or curve.width_ratio < settings.min_move ** 4 or not settings.headroom > 1):
        return curve
    middle = curve.chosen_ratio
    halfway = (math.sqrt(curve.width_lower * middle), math.sqrt(middle * curve.width_upper))
    overloaded = curve.metric == "raw_goodput"
    # the middle's score there where the heavier pair ran it on the same window at this load
    known = curve.headroom_chosen
    reused = known[1] if known is not None and known[0] == middle else None
    ratios = [halfway[0], halfway[1]] if reused is not None else [halfway[0], middle, halfway[1]]
    scores = [_score(result, overloaded)
              for result in run_many(server, heavier(picture, settings.headroom), ratios, settings)]
    at_low, at_high = scores[0], scores[-1]
    at_middle = reused if reused is not None else scores[1]
    marks: dict[str, Any] = {"lean_load": settings.headroom, "other_runs": curve.other_runs + len(ratios)}
    best_side, best_score = max(zip(halfway, (at_low, at_high), strict=True), key=lambda pair: pair[1])
    if not at_middle > 0 or not best_score > at_middle * (1.0 + 2.0 * curve.plateau_tolerance):
        return replace(curve, **marks)
    return _reread(curve, curve.points, tolerance=curve.counts_tolerance, live_ratio=live_ratio, settings=settings,
                   chosen=best_side, lean_from=middle, lean_gain=best_score / at_middle, **marks)


def regime_load(regime: TrafficPicture, sigmas: float) -> float:
    """1 + `sigmas` relative standard errors of the new regime's arrival count: Poisson's, times its per-minute
    counts' dispersion."""
    if not sigmas > 0 or not regime.requests:
        return 1.0
    times = np.asarray([request.time for request in regime.requests])
    dispersion = _count_dispersion(times, regime.window_seconds)
    return 1.0 + sigmas * math.sqrt(dispersion / len(regime.requests))


def _mean_size(requests: Sequence[RequestSpec]) -> float:
    return sum(r.input_tokens + r.output_tokens for r in requests) / max(1, len(requests))


def regime_curve(whole: ReplayCurve, recent: ReplayCurve, *, regime_seconds: float, live_ratio: float | None,
                 settings: ReplaySettings) -> ReplayCurve:
    """The curve the advice is read from after a regime shift: on the new regime's ratios, each one's score the
    smaller of its share of the new regime's best and of the whole window's, in the new regime's tokens/s. Where
    the two plateaus do not overlap, the same scores put the advice where the worse of the two shares is best: a
    regime can end (a drift from chat to documents that went back to chat), and a ratio on one plateau alone can
    be far down the other's cliff. The window's check against the server (the running batch at the live ratio) is
    the window's."""
    own = _with_window(recent, whole, regime_seconds=regime_seconds,
                       regime_plateau=(recent.width_lower, recent.width_upper))
    return _read_both(own, whole, live_ratio=live_ratio, settings=settings, regime=True)


def trend_curve(whole: ReplayCurve, ahead: ReplayCurve, *, load: float, live_ratio: float | None,
                settings: ReplaySettings) -> ReplayCurve:
    """The curve the advice is read from under a trend: the window's traffic `load` times heavier (`ahead`), each of
    its ratios scored the smaller of its share of that curve's best and of the window's, in the heavier traffic's
    tokens/s. Where the two plateaus do not overlap, the window's curve as observed: the heavier traffic is a
    forecast (a regime's replay is of traffic that came), and a rate that goes on rising shows in the next replays.
    Both plateaus are reported either way."""
    marks: dict[str, Any] = {"trend_load": load, "trend_plateau": (ahead.width_lower, ahead.width_upper)}
    own = _with_window(ahead, whole, **marks)
    if not own.reads_both_plateaus:
        return replace(whole, window_plateau=own.window_plateau, other_runs=whole.other_runs + ahead.runs, **marks)
    return _read_both(own, whole, live_ratio=live_ratio, settings=settings)


def _read_both(own: ReplayCurve, whole: ReplayCurve, *, live_ratio: float | None,
               settings: ReplaySettings, regime: bool = False) -> ReplayCurve:
    """`own` (the other curve, with the window's fields) read where both it and the window's curve are on their
    plateaus; where no ratio is, `own` as it is (a trend's caller returns before), or after a regime shift
    (`regime`) where the worse of its two shares is best."""
    if not own.reads_both_plateaus and not regime:
        return own
    own_best = max(p.goodput for p in own.points)
    whole_best = max(p.goodput for p in whole.points)
    if not own_best > 0 or not whole_best > 0:
        return own
    # After a regime shift the new regime's ratios may lie past the ones the window ran, and where the two plateaus
    # lie apart its share there decides: where its curve falls toward an end, it is read as falling on.
    whole_scores = {point.ratio: point.goodput for point in whole.points}
    whole_at = (lambda ratio: _falling_beyond(whole_scores, ratio)) if regime else whole.goodput_at
    scores = {p.ratio: own_best * min(p.goodput / own_best, whole_at(p.ratio) / whole_best) for p in own.points}
    return _reread(own, [replace(p, goodput=scores[p.ratio]) for p in own.points],
                   tolerance=max(own.counts_tolerance, whole.counts_tolerance), live_ratio=live_ratio,
                   settings=settings, headroom_gain=None, headroom=1.0, headroom_chosen=None,
                   other_runs=own.other_runs + (2 if own.headroom_gain is not None else 0))


def _reread(curve: ReplayCurve, points: list[CurvePoint], *, tolerance: float, live_ratio: float | None,
            settings: ReplaySettings, chosen: float | None = None, **changes: Any) -> ReplayCurve:
    """`curve` with other scores (`points`, by ratio): its plateau, choice (`chosen` where given, else the plateau's
    middle), hold band (cut where its heavier-traffic check found the live ratio only just serving,
    `_headroom_band`) and the scores read from them read again, within `tolerance` (the counts': the scores' own
    climb back near their best can widen it, `_plateau`), and `changes`."""
    scores = {p.ratio: p.goodput for p in points}
    counts_tolerance = tolerance
    best, plateau, tolerance = _plateau(scores, lambda _: counts_tolerance)
    chosen, hold_lower, hold_upper, (width_lower, width_upper) = _reading(
        plateau, settings, tolerance=tolerance, spread_scores=scores if curve.source == "metrics" else None,
        chosen=chosen)
    hold_lower, hold_upper = _headroom_band(hold_lower, hold_upper, live_ratio=live_ratio, chosen=chosen,
                                            headroom_gain=changes.get("headroom_gain", curve.headroom_gain),
                                            tolerance=tolerance)
    live = live_ratio if live_ratio is not None and live_ratio > 0 else None
    return replace(
        curve, points=points,
        chosen_ratio=chosen, best_ratio=best, width_lower=width_lower, width_upper=width_upper, flat=len(plateau) > 1,
        live_goodput=_interpolated(scores, live) if live is not None else None,
        chosen_goodput=_interpolated(scores, chosen), hold_lower=hold_lower, hold_upper=hold_upper,
        live_robust_goodput=_robust(scores, live, settings.cliff_margin) if live is not None else None,
        chosen_robust_goodput=_robust(scores, chosen, settings.cliff_margin),
        live_keep_robust_goodput=_robust(scores, live, settings.cliff_keep_margin) if live is not None else None,
        chosen_keep_robust_goodput=_robust(scores, chosen, settings.cliff_keep_margin),
        plateau_tolerance=tolerance, counts_tolerance=counts_tolerance, **changes,
    )


def _headroom_band(hold_lower: float, hold_upper: float, *, live_ratio: float | None, chosen: float,
                   headroom_gain: float | None, tolerance: float) -> tuple[float, float]:
    """The hold band, its live ratio's side cut to halfway (in log r) to the chosen ratio where the chosen ratio
    beat the live one on the heavier traffic beyond `tolerance`: the live ratio only just serves this draw, it is
    off the plateau the traffic, not the draw, has."""
    if headroom_gain is None or live_ratio is None or not live_ratio > 0 or not headroom_gain > 1.0 + tolerance:
        return hold_lower, hold_upper
    if live_ratio < chosen:
        return max(hold_lower, math.sqrt(live_ratio * chosen)), hold_upper
    return hold_lower, min(hold_upper, math.sqrt(live_ratio * chosen))


def _one_draw(curve: ReplayCurve) -> bool:
    """A plain replay of a metrics-only picture: the window's own curve (no regime, no trend read into it)."""
    return curve.source == "metrics" and curve.regime_seconds is None and curve.trend_load is None


def remembered_curve(current: ReplayCurve, previous: ReplayCurve | None, *, live_ratio: float | None,
                     settings: ReplaySettings) -> ReplayCurve:
    """`current` read again from its scores averaged with the `previous` replay's, where both are plain replays of a
    metrics-only picture (`_one_draw`) on the same metric; else `current` itself.

    Such a picture is one draw of the traffic the histograms allow (arrival times inside each scrape interval, lengths
    inside each bucket), and a sharp optimum's peak moves from one draw to the next by more than the optimum's own
    width; the mean of two draws moves less, where each replay is still of the window as it now is. A request-log
    picture is the requests themselves: there is no draw to average, and the previous window is only older traffic.

    Each ratio's score is the mean of the two curves' shares of their own best (the previous curve's interpolated
    where it ran around that ratio, else the current's alone), in the current's tokens/s, on the current's ratios
    and the previous ones inside their range (those points keep the previous replay's other figures)."""
    if previous is None or not (_one_draw(current) and _one_draw(previous)) or current.metric != previous.metric:
        return current
    own = current.points
    before = previous.draw_points if previous.draw_points is not None else previous.points
    own_best = max(p.goodput for p in own)
    before_best = max(p.goodput for p in before)
    if not own_best > 0 or not before_best > 0:
        return current
    own_shares = {p.ratio: p.goodput / own_best for p in own}
    before_shares = {p.ratio: p.goodput / before_best for p in before}
    low, high = min(own_shares), max(own_shares)
    before_low, before_high = min(before_shares), max(before_shares)

    def mean_score(ratio: float) -> float:
        shares = [_interpolated(own_shares, ratio)]
        if before_low <= ratio <= before_high:
            shares.append(_interpolated(before_shares, ratio))
        return own_best * sum(shares) / len(shares)

    points = [*own, *(p for p in before if low <= p.ratio <= high and p.ratio not in own_shares)]
    points = sorted((replace(p, goodput=mean_score(p.ratio)) for p in points), key=lambda p: p.ratio)
    return _reread(current, points, tolerance=current.counts_tolerance, live_ratio=live_ratio, settings=settings,
                   draw_points=own, draws=2)


def _with_window(other: ReplayCurve, whole: ReplayCurve, **marks: Any) -> ReplayCurve:
    """The other curve (a new regime's, the heavier traffic's) with what the window's replay says: what it replayed
    (the window and its requests: a heavier picture's window is shorter by its load, and the daemon reads this one
    as the window the last replay covered), its check against the server, its plateau, and `marks` (what the other
    curve is)."""
    return replace(
        other, **{name: getattr(whole, name) for name in WINDOW_FIELDS},
        window_plateau=(whole.width_lower, whole.width_upper),
        other_runs=whole.runs - whole.calibration_rounds,  # its re-pairings are calibration_rounds now
        **marks,
    )


# What a curve read with another (`_with_window`) keeps of the window's replay: what it replayed, and its checks of
# the picture against the server at the live ratio.
WINDOW_FIELDS = (
    "requests", "window_seconds", "live_context_shown", "live_context_replayed_before", "live_context_replayed",
    "live_running_shown", "live_running_replayed", "live_running_matches", "calibration_rounds",
    "queue_shown", "queue_replayed", "queue_load", "admission_rate_shown", "admission_rate_replayed", "work_scale",
)


def _followed_trend(server: SchedulerServerConfig, whole: ReplayCurve, picture: TrafficPicture, recent: float, *,
                    prior_ratio: float, live_ratio: float | None, settings: ReplaySettings,
                    run_many: RunMany) -> ReplayCurve:
    """`whole`, or where the window's last minutes came faster than its mean or the server queued more than the
    replay (`recent`: the larger of its `recent_load`, at most `headroom_max`, and the queue check's load) the
    `trend_curve` of the window and of its traffic that much heavier. The heavier traffic is the window's own
    picture, already checked against the server; it runs no heavier pair of its own."""
    load = recent
    if not settings.follow_trend or not load > 1.0:
        return whole
    ahead_picture = replace(heavier(picture, load), live_context=None, live_running=None, live_queue_times=None,
                            live_queue_series=None)
    ahead, _, _ = _window_curve(server, ahead_picture, prior_ratio=prior_ratio, live_ratio=live_ratio,
                                settings=settings, run_many=run_many, heavier_pair=False,
                                also=(whole.width_lower, whole.chosen_ratio, whole.width_upper))
    if ahead is None:
        return whole
    return trend_curve(whole, ahead, load=load, live_ratio=live_ratio, settings=settings)


def _window_curve(
    server: SchedulerServerConfig,
    picture: TrafficPicture,
    *,
    prior_ratio: float,
    live_ratio: float | None,
    settings: ReplaySettings,
    run_many: RunMany,
    also: Sequence[float] = (),
    heavier_pair: bool = True,
) -> tuple[ReplayCurve | None, TrafficPicture, float]:
    """`replay_curve` of one picture, with the picture it replayed (its outputs paired again where the replay at
    the live ratio asked for it) and its `recent_load` (1.0 without the heavier pair). The ratios `also` join the
    first candidates (a new regime is run where the window's plateau is, so that whether the two overlap is
    measured, not extrapolated). Without `heavier_pair` the live and chosen ratios are not run on heavier traffic
    (the curve is itself of heavier traffic)."""
    if len(picture.requests) < settings.min_requests or not prior_ratio > 0:
        return None, picture, 1.0
    step = settings.span ** (2.0 / (settings.points - 1))
    half = (settings.points - 1) // 2
    ratios = sorted({*(prior_ratio * step ** k for k in range(-half, half + 1)), *(r for r in also if r > 0)})
    first = list(ratios)
    results: dict[float, SimResult] = {}
    calibration = None
    work: WorkMatch | None = None
    if live_ratio is not None and live_ratio > 0:
        # the live ratio first: the picture is checked against what the server showed there, its admission rate
        # (the work its outputs carry), then its running batch's length (how they pair with the prompts)
        at_live = run_many(server, picture, [live_ratio], settings)[0]
        picture, at_live, work = _work_matched(server, picture, at_live, live_ratio, settings, run_many)
        picture, results[live_ratio], calibration = calibrated_picture(server, picture, live_ratio, settings,
                                                                       run_many, at_live=at_live)
        first = [r for r in first if r != live_ratio]
    results.update(zip(first, run_many(server, picture, first, settings), strict=True))

    overloaded = _overloaded(results.values())

    def score(r: float) -> float:
        return _score(results[r], overloaded)

    def tolerance_of(best: float) -> float:
        """The share of the best score within which another is as good: the plateau's, and the replay's noise."""
        return max(settings.flat_tolerance, 0.25 / math.sqrt(max(1, results[best].completed_requests)))

    def plateau_of(candidates: list[float]) -> tuple[float, list[float], float]:
        return _plateau({r: score(r) for r in candidates}, tolerance_of)

    queue = (_queue_check(server, picture, results[live_ratio], live_ratio, settings, run_many)
             if heavier_pair and live_ratio is not None and live_ratio > 0 else _QueueCheck(None, None, None, 0))
    _, plateau, _ = plateau_of(sorted(results))
    # Refine just outside the plateau's ends, where the curve leaves it.
    refine = [r for r in (plateau[0] / math.sqrt(step), plateau[-1] * math.sqrt(step))
              if r not in results and min(ratios) / step <= r <= max(ratios) * step]
    results.update(zip(refine, run_many(server, picture, refine, settings), strict=True))
    # A plateau of one candidate is a sharp optimum: bracket it closer, a quarter then an eighth of the step.
    for round_index in range(settings.sharp_refinements):
        best, plateau, _ = plateau_of(sorted(results))
        if len(plateau) > 1:
            break
        factor = step ** (0.25 / 2 ** round_index)
        closer = [r for r in (best / factor, best * factor) if r not in results]
        if not closer:
            break
        results.update(zip(closer, run_many(server, picture, closer, settings), strict=True))
    # A plateau end with no tried ratio within half a step outside it (the plateau reached the refined point, or
    # the next one tried is the live ratio far off): where the curve falls on that side is unknown, and the
    # middle would be the middle of what was tried. Probe once more, half a step out.
    tried = sorted(results)
    _, plateau, _ = plateau_of(tried)
    probes = [r for r in _open_ends(tried, plateau, math.sqrt(step))
              if r not in results and min(ratios) / step ** 2 <= r <= max(ratios) * step ** 2]
    if live_ratio is not None and live_ratio > 0:
        # The worst score within the keep margin of the live ratio is measured, never extrapolated from the last
        # ratio tried: a live ratio at the edge of what was tried would otherwise look safe from a cliff just past it
        # in one replay and not in the next.
        tried_low, tried_high = min([*results, *probes]), max([*results, *probes])
        probes += [r for r in (live_ratio / settings.cliff_keep_margin, live_ratio * settings.cliff_keep_margin)
                   if not tried_low <= r <= tried_high]
    results.update(zip(probes, run_many(server, picture, probes, settings), strict=True))
    candidates = sorted(results)  # the live ratio too: where it is as good as the best, the operator holds
    best, plateau, tolerance = plateau_of(candidates)
    scores = {r: score(r) for r in results}
    chosen, hold_lower, hold_upper, (width_lower, width_upper) = _reading(
        plateau, settings, tolerance=tolerance, spread_scores=scores if picture.source == "metrics" else None)
    metric = "raw_goodput" if overloaded else "goodput_score"
    chosen_goodput = _interpolated(scores, chosen)

    def robust(r: float, margin: float = settings.cliff_margin) -> float:
        return _robust(scores, r, margin)

    headroom_gain = None
    capacity_runs = 0
    chosen_heavier: dict[float, float] = {}  # the chosen ratio's score on each heavier load the pair ran
    load = min(settings.headroom_max, recent_load(picture, settings.trend_seconds)) if heavier_pair else 1.0
    load = max(load, queue.load or 1.0)
    headroom = max(settings.headroom, load)
    if (heavier_pair and live_ratio is not None and live_ratio > 0 and headroom > 1
            and abs(math.log(chosen / live_ratio)) > math.log(settings.min_move)):
        plain = _gain(chosen_goodput, scores[live_ratio])
        robust_plain = _gain(robust(chosen), robust(live_ratio))
        def pair_gain(heavier_by: float) -> float | None:
            """The chosen ratio's score over the live one's on the window `heavier_by` times heavier (two runs)."""
            at_live, at_chosen = run_many(server, heavier(picture, heavier_by), [live_ratio, chosen], settings)
            chosen_heavier[heavier_by] = _score(at_chosen, overloaded)
            return _gain(chosen_heavier[heavier_by], _score(at_live, overloaded))

        if max(g or 0.0 for g in (plain, robust_plain)) < settings.headroom_below_gain:
            headroom_gain = pair_gain(headroom)
            if settings.capacity_load > headroom and (headroom_gain or 0.0) < settings.headroom_below_gain:
                capacity_gain = pair_gain(settings.capacity_load)
                capacity_runs = 2
                if capacity_gain is not None and capacity_gain > (headroom_gain or 0.0):
                    headroom_gain, headroom = capacity_gain, settings.capacity_load
            hold_lower, hold_upper = _headroom_band(hold_lower, hold_upper, live_ratio=live_ratio, chosen=chosen,
                                                    headroom_gain=headroom_gain, tolerance=tolerance)

    points = [
        CurvePoint(
            ratio=r, goodput=scores[r], slo_goodput=_slo_goodput(res),
            raw_goodput=_raw_goodput(res), max_running_requests=res.max_running_requests,
            kv_capacity_tokens=res.kv_capacity_tokens, state_bound_fraction=res.state_bound_fraction,
            kv_bound_fraction=res.kv_bound_fraction, retracted_requests=res.retracted_requests,
            queue_time_p90=res.queue_time_p90,
        )
        for r, res in sorted(results.items())
    ]
    return ReplayCurve(
        points=points, chosen_ratio=chosen, best_ratio=best, prior_ratio=prior_ratio,
        width_lower=width_lower, width_upper=width_upper, flat=len(plateau) > 1, metric=metric,
        requests=len(picture.requests), window_seconds=picture.window_seconds, source=picture.source,
        live_goodput=scores.get(live_ratio) if live_ratio is not None else None, chosen_goodput=chosen_goodput,
        step_time=server.cost.to_dict(), hold_lower=hold_lower, hold_upper=hold_upper,
        live_robust_goodput=robust(live_ratio) if live_ratio is not None and live_ratio > 0 else None,
        chosen_robust_goodput=robust(chosen),
        live_keep_robust_goodput=(robust(live_ratio, settings.cliff_keep_margin)
                                  if live_ratio is not None and live_ratio > 0 else None),
        chosen_keep_robust_goodput=robust(chosen, settings.cliff_keep_margin),
        live_context_shown=calibration.shown if calibration else None,
        live_context_replayed_before=calibration.replayed_before if calibration else None,
        live_context_replayed=calibration.replayed if calibration else None,
        live_running_shown=calibration.shown_running if calibration else None,
        live_running_replayed=calibration.replayed_running if calibration else None,
        live_running_matches=calibration.running_matches(settings) if calibration else None,
        calibration_rounds=calibration.rounds if calibration else 0,
        headroom_gain=headroom_gain, headroom=headroom if headroom_gain is not None else 1.0,
        headroom_chosen=((chosen, chosen_heavier[settings.headroom]) if settings.headroom in chosen_heavier
                         else None),
        plateau_tolerance=tolerance, counts_tolerance=tolerance_of(best),
        queue_shown=queue.shown, queue_replayed=queue.replayed, queue_load=queue.load,
        admission_rate_shown=work.shown if work else None, admission_rate_replayed=work.replayed if work else None,
        work_scale=work.scale if work else None,
        other_runs=queue.runs + (work.runs if work else 0) + capacity_runs,
    ), picture, load


class _QueueCheck(NamedTuple):
    shown: float | None  # the server's share of requests queued beyond the bound
    replayed: float | None  # the replay's at the live ratio
    load: float | None  # how much heavier the window queues as the server did (None: no heavier load needed)
    runs: int  # the heavier runs at the live ratio it took


def _queued_over(result: SimResult) -> float | None:
    if result.admitted_requests <= 0:
        return None
    return result.admitted_over_bound_requests / result.admitted_requests


def _queue_check(server: SchedulerServerConfig, picture: TrafficPicture, at_live: SimResult, live_ratio: float,
                 settings: ReplaySettings, run_many: RunMany) -> _QueueCheck:
    """The server's queue against the replay's at the live ratio (`at_live`), and where the server queued more
    (beyond `queue_margin` and twice the share's sampling noise over the requests the replay admitted), the load
    the window's traffic is made heavier by until its replay there queues as much. Near capacity the share climbs
    from nothing to most requests within a few percent of load, so the load is bracketed (queue_first_load, then
    queue_load_max where that is not enough) and narrowed in log load for the rest of `queue_rounds` runs, or until
    a load queues within the share's noise of the server's: the load tried whose share is nearest the server's. A
    replay that queues more than the server is left as it is: the curve it reads is the safer one (made lighter to match, on the watched metrics-only protocol, the replay
    moved eight rows, five down, heavy-tail outputs s2 95.3% -> 91.8%: the trial of the session that wrote this
    check, on the older count of finished requests' whole waits and a 2-point margin)."""
    if picture.live_queue_times is None:
        return _QueueCheck(None, None, None, 0)
    # The server's share over the whole window, though the replay measures after its warmup: where a queue builds
    # through the window its first minutes hold fewer long waits, and the share over the replay's measured part
    # reads higher (diurnal TP8 s2: 0.853 against 0.780). Read so, the check fired more often, chiefly on bursty
    # traffic whose bursts a scrape's counts hide, where the heavier load then raised r past the optimum (held-out
    # doc-bursts TP2 s1 99.9% -> 97.9%): the mean moved +0.06 points watched, -0.06 held-out and -0.09 on /metrics
    # alone, all three metrics-only, and the whole window's share stays.
    shown = queue_share_over(*picture.live_queue_times, settings.queue_time_bound)
    replayed = _queued_over(at_live)
    if shown is None or replayed is None:
        return _QueueCheck(shown, replayed, None, 0)
    sigma = math.sqrt(shown * (1.0 - shown) / at_live.admitted_requests)  # the share's sampling noise
    if (shown - replayed <= settings.queue_margin + 2.0 * sigma or settings.queue_rounds == 0
            or not settings.queue_load_max > 1.0):
        return _QueueCheck(shown, replayed, None, 0)
    tried: dict[float, float] = {1.0: replayed}

    def short_of(load: float) -> bool:
        """The replay at `load` still queues less than the server."""
        if load not in tried:
            result = run_many(server, heavier(picture, load), [live_ratio], settings)[0]
            tried[load] = _queued_over(result) or 0.0
        return tried[load] < shown

    def nearest() -> float:
        return min(tried, key=lambda k: (abs(tried[k] - shown), -k))

    # A load whose share is within one standard deviation of the server's (its sampling noise over the requests the
    # replay admitted) is as close as the two counts can tell apart: the search stops there.
    light, heavy = 1.0, min(settings.queue_first_load, settings.queue_load_max)
    if short_of(heavy) and heavy < settings.queue_load_max and len(tried) - 1 < settings.queue_rounds:
        light, heavy = heavy, settings.queue_load_max
        short_of(heavy)
    if not short_of(heavy):
        while len(tried) - 1 < settings.queue_rounds and abs(tried[nearest()] - shown) > sigma:
            # where in log load the share crosses the server's, read off the bracket's ends (the share climbs
            # steadily across a narrow bracket), kept to its middle half (it is no straight line across a wide one)
            rise = tried[heavy] - tried[light]
            part = min(0.75, max(0.25, (shown - tried[light]) / rise)) if rise > 0 else 0.5
            middle = light * (heavy / light) ** part
            if short_of(middle):
                light = middle
            else:
                heavy = middle
    load = nearest()
    return _QueueCheck(shown, replayed, load if load > 1.0 else None, len(tried) - 1)


def recent_load(picture: TrafficPicture, seconds: float) -> float:
    """The arrival rate of the window's last `seconds` over the window's own, where the same traffic came faster and
    still rose after the window's middle: 1.0 when the last minutes' count exceeds the window's expectation, or that
    of as long a stretch about the window's middle, by no more than TREND_SIGMAS of its noise; when the last
    minutes' mean request (prompt and output) differs from the window's by more than TREND_CHARACTER_FACTOR (other
    traffic, a regime shift, is not more of the same); or for a window under three times `seconds` (too short to
    tell a trend from a burst). The noise is Poisson's times the per-minute counts' dispersion about their line
    (at least 1): a conversation's turns come in runs, and agentic sessions count twice Poisson's spread and more.
    A rise over by the window's middle (a new server's sessions building up, a step long past) is no trend of the
    traffic to come."""
    window = picture.window_seconds
    if window < 3 * seconds or not picture.requests:
        return 1.0
    times = np.asarray([request.time for request in picture.requests])
    recent = [request for request in picture.requests if request.time >= window - seconds]
    expected = len(picture.requests) * seconds / window
    middle = float(np.count_nonzero(np.abs(times - window / 2) < seconds / 2))
    dispersion = _count_dispersion(times, window)
    if (len(recent) - expected <= TREND_SIGMAS * math.sqrt(expected * dispersion)
            or len(recent) - middle <= TREND_SIGMAS * math.sqrt((len(recent) + middle) * dispersion)):
        return 1.0

    character = _mean_size(recent) / _mean_size(picture.requests)
    if not 1.0 / TREND_CHARACTER_FACTOR <= character <= TREND_CHARACTER_FACTOR:
        return 1.0
    return len(recent) / expected


def _count_dispersion(times: np.ndarray, window: float, minute: float = 60.0) -> float:
    """The variance of the window's per-minute arrival counts about their least-squares line over their mean (1 for
    Poisson arrivals on a steady or ramping rate), at least 1."""
    bins = int(window // minute)
    if bins < 4:
        return 1.0
    counts = np.histogram(times, bins=window - minute * np.arange(bins, -1, -1))[0].astype(float)
    if not counts.mean() > 0:
        return 1.0
    x = np.arange(bins, dtype=float)
    slope, intercept = np.polyfit(x, counts, 1)
    residuals = counts - (intercept + slope * x)
    return max(1.0, float(residuals @ residuals) / (bins - 2) / float(counts.mean()))


# A rise of the window's last minutes' count over its expectation by more than this many of its noise's standard
# deviations is a trend, not a draw ...
TREND_SIGMAS = 3.0
# ... if their mean request is within this factor of the window's (the replay's own regime-shift factor).
TREND_CHARACTER_FACTOR = 1.33


def heavier(picture: TrafficPicture, factor: float) -> TrafficPicture:
    """The window's traffic `factor` times heavier: the same requests, their arrivals (and a conversation's turns)
    closer together by that factor, over a window as much shorter."""
    return replace(picture, requests=[replace(request, time=request.time / factor) for request in picture.requests],
                   window_seconds=picture.window_seconds / factor)
