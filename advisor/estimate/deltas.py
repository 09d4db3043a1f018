"""Per-interval deltas of SGLang's lifetime counters between two `/metrics` scrapes (pure).

Counters and token histograms only ever grow while a server lives; a decrease, a vanished series, a changed
DP layout, changed histogram buckets or a changed pool constant means the server restarted. Then every delta
is rebased on the current value (the counters restarted from 0) and `restarted` tells the caller to re-read
the serving config.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    counts = tuple(
        now - before
        for now, before in zip(current.cumulative_counts, previous.cumulative_counts, strict=True)
    )
    if current.count < previous.count or any(count < 0 for count in counts):
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
