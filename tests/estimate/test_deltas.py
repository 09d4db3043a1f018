"""Counter deltas between scrapes: per DP rank, histogram buckets, first scrape, restarts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from advisor.estimate.deltas import diff_counters
from advisor.sources.metrics import Histogram, MetricsObservation, RankMetrics, parse_metrics

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def _rank(
    dp_rank: int | None, retracted: float, inputs: float, outputs: float, kv_capacity: int = 1000
) -> RankMetrics:
    return RankMetrics(
        dp_rank=dp_rank,
        kv_capacity_tokens=kv_capacity,
        page_size=1,
        context_len=4096,
        retracted_requests_total=retracted,
        retracted_input_tokens_total=inputs,
        retracted_output_tokens_total=outputs,
    )


def _hist(
    counts: tuple[float, ...], total: float, bounds: tuple[float, ...] = (100.0, 1000.0, float("inf"))
) -> Histogram:
    return Histogram(upper_bounds=bounds, cumulative_counts=counts, sum=total, count=counts[-1])


def _observation(
    ranks: list[RankMetrics], requests: float, prompt: float, histogram: Histogram
) -> MetricsObservation:
    return MetricsObservation(
        ranks=ranks,
        requests_total=requests,
        prompt_tokens_total=prompt,
        generation_tokens_total=requests * 10,
        prompt_tokens_histogram=histogram,
    )


PREV = _observation([_rank(0, 5, 500, 50), _rank(1, 2, 200, 20)], 100, 10_000, _hist((10, 80, 100), 10_000))
CUR = _observation([_rank(0, 8, 800, 90), _rank(1, 2, 200, 20)], 130, 14_000, _hist((12, 105, 130), 14_000))


def test_per_rank_and_global_deltas() -> None:
    delta = diff_counters(PREV, CUR, interval_seconds=30.0)
    assert not delta.restarted and not delta.since_start
    assert [
        (r.dp_rank, r.retracted_requests, r.retracted_input_tokens, r.retracted_output_tokens)
        for r in delta.ranks
    ] == [
        (0, 3, 300, 40),
        (1, 0, 0, 0),
    ]
    assert delta.retracted_requests == 3
    assert (delta.requests, delta.prompt_tokens, delta.generation_tokens) == (30, 4000, 300)
    assert delta.aborted_requests is None and delta.cached_tokens is None
    assert delta.per_second(delta.requests) == pytest.approx(1.0)
    histogram = delta.prompt_tokens_histogram
    assert histogram is not None
    assert histogram.cumulative_counts == (2, 25, 30)
    assert histogram.bucket_counts() == (2, 23, 5)
    assert (histogram.sum, histogram.count) == (4000, 30)


def test_first_scrape_gives_lifetime_totals() -> None:
    delta = diff_counters(None, CUR)
    assert delta.since_start and not delta.restarted
    assert delta.ranks[0].retracted_requests == 8 and delta.requests == 130
    assert delta.per_second(delta.requests) is None


def test_counter_appearing_on_first_increment_counts_from_zero() -> None:
    prev = replace(PREV, ranks=[replace(r, retracted_requests_total=None) for r in PREV.ranks])
    delta = diff_counters(prev, CUR)
    assert not delta.restarted
    assert delta.ranks[0].retracted_requests == 8


@pytest.mark.parametrize(
    ("cur", "reason"),
    [
        (replace(CUR, requests_total=3.0), "requests_total went down"),
        (
            replace(CUR, ranks=[_rank(0, 1, 10, 1), CUR.ranks[1]]),
            "dp_rank 0 retracted_requests_total went down",
        ),
        (replace(CUR, prompt_tokens_histogram=_hist((1, 2, 3), 100)), "count went down"),
        (
            replace(
                CUR, prompt_tokens_histogram=_hist((1, 2, 200, 200), 10**6, (10.0, 100.0, 1e4, float("inf")))
            ),
            "buckets changed",
        ),
        (replace(CUR, ranks=[CUR.ranks[0]]), "DP ranks changed"),
        (
            replace(CUR, ranks=[_rank(0, 9, 900, 99, kv_capacity=2000), CUR.ranks[1]]),
            "kv_capacity_tokens changed",
        ),
        (replace(CUR, prompt_tokens_total=None), "prompt_tokens_total disappeared"),
    ],
)
def test_restart_rebases_on_current_values(cur: MetricsObservation, reason: str) -> None:
    delta = diff_counters(PREV, cur)
    assert delta.restarted and not delta.since_start
    assert any(reason in text for text in delta.restart_reasons), delta.restart_reasons
    # Rebased: the counters restarted from 0, so the interval's growth is the current value.
    assert delta.requests == cur.requests_total
    assert [r.retracted_requests for r in delta.ranks] == [r.retracted_requests_total for r in cur.ranks]
    assert delta.prompt_tokens_histogram == cur.prompt_tokens_histogram


def test_same_scrape_twice_is_all_zero_on_the_genuine_fixture() -> None:
    observation = parse_metrics((METRICS / "sglang-0.5.23-dp2tp4.prom").read_text())
    delta = diff_counters(observation, observation)
    assert not delta.restarted
    assert [r.retracted_requests for r in delta.ranks] == [0, 0]
    assert delta.requests == 0 and delta.prompt_tokens == 0 and delta.cached_tokens == 0
    assert delta.generation_tokens_histogram is not None
    assert set(delta.generation_tokens_histogram.cumulative_counts) == {0}
