"""Per-interval deltas of SGLang's lifetime counters between two `/metrics` scrapes (pure), and a tracker that
keeps them honest across restarts, counters going backwards and a URL flipping between servers.

Counters and token histograms only ever grow while a server lives; a decrease, a vanished series, a changed
DP layout, changed histogram buckets or a changed pool constant means the server restarted. `diff_counters`
then rebases every delta on the current value and sets `restarted`. `CounterTracker` goes further: it keeps
the last scrape of a few recent counter lineages, so a flip back to an earlier server (or a counter that
dipped and recovered) is diffed against that server's own last scrape, and a lineage never seen before is
a baseline (nothing added): lifetime totals are never re-added, at the cost of at most one interval of
traffic after a genuine restart.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, replace

from advisor.sources.metrics import Histogram, MetricsObservation, RankMetrics

_RANK_COUNTERS = (
    ("retracted_requests", "retracted_requests_total"),
    ("retracted_input_tokens", "retracted_input_tokens_total"),
    ("retracted_output_tokens", "retracted_output_tokens_total"),
)
_GLOBAL_COUNTERS = (
    ("requests", "requests_total"),
    ("aborted_requests", "aborted_requests_total"),
    ("prompt_tokens", "prompt_tokens_total"),
    ("generation_tokens", "generation_tokens_total"),
    ("cached_tokens", "cached_tokens_total"),
)
_HISTOGRAMS = ("prompt_tokens_histogram", "generation_tokens_histogram", "queue_time_histogram")
# Set once at scheduler start (metrics_collector.py emit_constants): a change means a new server.
_RANK_CONSTANTS = ("kv_capacity_tokens", "page_size", "context_len")


@dataclass(frozen=True)
class RankCounterDelta:
    """Growth of one DP rank's retraction counters over the interval (None: the family is absent)."""

    dp_rank: int | None
    retracted_requests: float | None = None
    retracted_input_tokens: float | None = None
    retracted_output_tokens: float | None = None


@dataclass(frozen=True)
class ObservationDelta:
    """What happened between two scrapes. Histograms hold bucket-wise deltas (cumulative per bound)."""

    ranks: list[RankCounterDelta]
    requests: float | None
    aborted_requests: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    cached_tokens: float | None
    prompt_tokens_histogram: Histogram | None
    generation_tokens_histogram: Histogram | None
    queue_time_histogram: Histogram | None
    restarted: bool
    restart_reasons: tuple[str, ...]
    since_start: bool  # no previous scrape: the deltas are the lifetime totals
    interval_seconds: float | None

    @property
    def retracted_requests(self) -> float | None:
        """Retracted requests over all DP ranks (None when no rank reports the counter)."""
        values = [rank.retracted_requests for rank in self.ranks if rank.retracted_requests is not None]
        return sum(values) if values else None

    def per_second(self, value: float | None) -> float | None:
        """A delta as a rate over the interval, when both are known."""
        if value is None or not self.interval_seconds or self.interval_seconds <= 0:
            return None
        return value / self.interval_seconds


def _counter_delta(
    previous: float | None, current: float | None, name: str, reasons: list[str]
) -> float | None:
    if current is None:
        if previous is not None:
            reasons.append(f"{name} disappeared")
        return None
    if previous is None:
        return current  # a labelled counter appears on its first increment: it grew from 0
    if current < previous:
        reasons.append(f"{name} went down ({previous:g} -> {current:g})")
    return current - previous


def _histogram_delta(
    previous: Histogram | None, current: Histogram | None, name: str, reasons: list[str]
) -> Histogram | None:
    if current is None:
        if previous is not None:
            reasons.append(f"{name} disappeared")
        return None
    if previous is None:
        return current
    if previous.upper_bounds != current.upper_bounds:
        reasons.append(f"{name} buckets changed")
        return current
    if len(current.cumulative_counts) != len(previous.cumulative_counts):
        raise ValueError(f"{name}: cumulative counts do not match its buckets")
    counts = tuple(map(operator.sub, current.cumulative_counts, previous.cumulative_counts))
    if current.count < previous.count or any(map(operator.lt, counts, itertools.repeat(0.0))):
        reasons.append(f"{name} count went down ({previous.count:g} -> {current.count:g})")
    return Histogram(
        upper_bounds=current.upper_bounds,
        cumulative_counts=counts,
        sum=current.sum - previous.sum,
        count=current.count - previous.count,
    )


def _rank_label(dp_rank: int | None) -> str:
    return "rank" if dp_rank is None else f"dp_rank {dp_rank}"


def _since_start(
    cur: MetricsObservation, interval_seconds: float | None, *, restarted: bool, reasons: tuple[str, ...]
) -> ObservationDelta:
    """Deltas equal to the current totals: the first scrape, or the first after a restart (rebased)."""
    return ObservationDelta(
        ranks=[
            RankCounterDelta(
                rank.dp_rank,
                rank.retracted_requests_total,
                rank.retracted_input_tokens_total,
                rank.retracted_output_tokens_total,
            )
            for rank in cur.ranks
        ],
        requests=cur.requests_total,
        aborted_requests=cur.aborted_requests_total,
        prompt_tokens=cur.prompt_tokens_total,
        generation_tokens=cur.generation_tokens_total,
        cached_tokens=cur.cached_tokens_total,
        prompt_tokens_histogram=cur.prompt_tokens_histogram,
        generation_tokens_histogram=cur.generation_tokens_histogram,
        queue_time_histogram=cur.queue_time_histogram,
        restarted=restarted,
        restart_reasons=reasons,
        since_start=not restarted,
        interval_seconds=interval_seconds,
    )


def diff_counters(
    prev: MetricsObservation | None,
    cur: MetricsObservation,
    *,
    interval_seconds: float | None = None,
) -> ObservationDelta:
    """Deltas of every counter from `prev` to `cur`, per DP rank for the retraction counters.

    `interval_seconds` (the caller's clock, scrape to scrape) is carried for `per_second`. With no `prev`
    the deltas are the lifetime totals and `since_start` is set.
    """
    if prev is None:
        return _since_start(cur, interval_seconds, restarted=False, reasons=())
    reasons: list[str] = []
    previous_ranks: dict[int | None, RankMetrics] = {rank.dp_rank: rank for rank in prev.ranks}
    current_ranks: dict[int | None, RankMetrics] = {rank.dp_rank: rank for rank in cur.ranks}
    missing = set(previous_ranks) - set(current_ranks)
    added = set(current_ranks) - set(previous_ranks)
    if missing or (added and previous_ranks):
        reasons.append(
            f"DP ranks changed ({sorted(previous_ranks, key=str)} -> {sorted(current_ranks, key=str)})"
        )
    rank_deltas = []
    for rank in cur.ranks:
        before = previous_ranks.get(rank.dp_rank)
        label = _rank_label(rank.dp_rank)
        if before is not None:
            for constant in _RANK_CONSTANTS:
                old, new = getattr(before, constant), getattr(rank, constant)
                if old is not None and new is not None and old != new:
                    reasons.append(f"{label} {constant} changed ({old} -> {new})")
        values = [
            _counter_delta(
                getattr(before, source) if before else None,
                getattr(rank, source),
                f"{label} {source}",
                reasons,
            )
            for _, source in _RANK_COUNTERS
        ]
        rank_deltas.append(RankCounterDelta(rank.dp_rank, *values))
    counters = {
        name: _counter_delta(getattr(prev, source), getattr(cur, source), source, reasons)
        for name, source in _GLOBAL_COUNTERS
    }
    histograms = {
        name: _histogram_delta(getattr(prev, name), getattr(cur, name), name, reasons) for name in _HISTOGRAMS
    }
    if reasons:
        return _since_start(cur, interval_seconds, restarted=True, reasons=tuple(reasons))
    return ObservationDelta(
        ranks=rank_deltas,
        requests=counters["requests"],
        aborted_requests=counters["aborted_requests"],
        prompt_tokens=counters["prompt_tokens"],
        generation_tokens=counters["generation_tokens"],
        cached_tokens=counters["cached_tokens"],
        prompt_tokens_histogram=histograms["prompt_tokens_histogram"],
        generation_tokens_histogram=histograms["generation_tokens_histogram"],
        queue_time_histogram=histograms["queue_time_histogram"],
        restarted=False,
        restart_reasons=(),
        since_start=False,
        interval_seconds=interval_seconds,
    )


SWITCH_GROWTH_FACTOR = 10.0


def _growth(delta: ObservationDelta) -> float:
    """How much happened in a (consistent) delta: the sum of every counter's growth, to pick the nearest
    predecessor among remembered scrapes (the right one grew least)."""
    total = 0.0
    for value in (delta.requests, delta.aborted_requests, delta.prompt_tokens, delta.generation_tokens,
                  delta.cached_tokens, delta.retracted_requests):
        if value is not None and math.isfinite(value):
            total += value
    for histogram in (delta.prompt_tokens_histogram, delta.generation_tokens_histogram, delta.queue_time_histogram):
        if histogram is not None and math.isfinite(histogram.count):
            total += histogram.count
    return total


def _zero_histogram(histogram: Histogram | None) -> Histogram | None:
    if histogram is None:
        return None
    return Histogram(histogram.upper_bounds, tuple(0.0 for _ in histogram.upper_bounds), 0.0, 0.0)


def _baseline(cur: MetricsObservation, reasons: tuple[str, ...]) -> ObservationDelta:
    """Nothing happened (as far as we can tell): the first scrape of a lineage we have not seen before."""

    def zero(value: float | None) -> float | None:
        return None if value is None else 0.0

    return ObservationDelta(
        ranks=[
            RankCounterDelta(rank.dp_rank, zero(rank.retracted_requests_total), zero(rank.retracted_input_tokens_total),
                             zero(rank.retracted_output_tokens_total))
            for rank in cur.ranks
        ],
        requests=zero(cur.requests_total),
        aborted_requests=zero(cur.aborted_requests_total),
        prompt_tokens=zero(cur.prompt_tokens_total),
        generation_tokens=zero(cur.generation_tokens_total),
        cached_tokens=zero(cur.cached_tokens_total),
        prompt_tokens_histogram=_zero_histogram(cur.prompt_tokens_histogram),
        generation_tokens_histogram=_zero_histogram(cur.generation_tokens_histogram),
        queue_time_histogram=_zero_histogram(cur.queue_time_histogram),
        restarted=True,
        restart_reasons=reasons,
        since_start=False,
        interval_seconds=None,
    )


class CounterTracker:
    """Successive scrapes of one target -> honest deltas, and a count of the restarts (or server switches)
    seen. Keeps at most `max_lineages` observations, each forgotten after `forget_after` scrapes without a
    match (so a restarted server whose totals later overtake its predecessor's is not mistaken for it);
    each diff costs at most `max_lineages` calls of `diff_counters`."""

    def __init__(self, max_lineages: int = 4, forget_after: int = 4) -> None:
        self.max_lineages = max(1, int(max_lineages))
        self.forget_after = max(1, int(forget_after))
        self._recent: list[tuple[MetricsObservation, int]] = []  # (last scrape, scrape number), newest first
        self._scrapes = 0
        self.restarts_total = 0
        self.last_restart_timestamp: float | None = None
        self.last_restart_reason: str | None = None

    @property
    def previous(self) -> MetricsObservation | None:
        return self._recent[0][0] if self._recent else None

    def diff(self, cur: MetricsObservation, now: float | None = None,
             interval_seconds: float | None = None) -> ObservationDelta:
        """The delta of `cur` against the remembered scrape it continues (least growth among the consistent
        ones). None consistent: a restart or an unseen server, counted, and a baseline delta."""
        self._scrapes += 1
        if not self._recent:
            self._recent = [(cur, self._scrapes)]
            return diff_counters(None, cur, interval_seconds=interval_seconds)
        newest = self._recent[0]
        self._recent = [newest] + [item for item in self._recent[1:] if self._scrapes - item[1] <= self.forget_after]
        newest_delta = diff_counters(newest[0], cur, interval_seconds=interval_seconds)
        first_reasons = newest_delta.restart_reasons
        best: tuple[float, int, ObservationDelta] | None = None
        for index, (earlier, _) in enumerate(self._recent[1:], start=1):
            delta = diff_counters(earlier, cur, interval_seconds=interval_seconds)
            if delta.restarted:
                continue
            growth = _growth(delta)
            if best is None or growth < best[0]:
                best = (growth, index, delta)
        # The newest scrape wins unless it is inconsistent, or an older one is a far closer predecessor (a flip
        # from a big server to a small one and back looks like growth: ten times less growth says otherwise).
        if not newest_delta.restarted and (best is None or best[0] * SWITCH_GROWTH_FACTOR >= _growth(newest_delta)):
            self._recent[0] = (cur, self._scrapes)
            return newest_delta
        if best is not None:
            _, index, delta = best
            del self._recent[index]
            self._recent.insert(0, (cur, self._scrapes))
            reason = "counters continue an earlier scrape, not the last one (the URL flipped between servers, or a dip recovered)"
            self._record(now, reason)
            return replace(delta, restarted=True, restart_reasons=(reason, *first_reasons))
        self._recent.insert(0, (cur, self._scrapes))
        del self._recent[self.max_lineages :]
        reason = "restart or new server: " + (first_reasons[0] if first_reasons else "counters changed")
        self._record(now, reason)
        return replace(_baseline(cur, (reason, *first_reasons)), interval_seconds=interval_seconds)

    def _record(self, now: float | None, reason: str) -> None:
        self.restarts_total += 1
        self.last_restart_timestamp = now
        self.last_restart_reason = reason
