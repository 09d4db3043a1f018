"""CounterTracker: counters going backwards, a URL flipping between two servers and genuine restarts are
detected and counted, and lifetime totals are never re-added (pairwise diffs would add them at every flip)."""

from __future__ import annotations

from dataclasses import replace

from support import METRICS

from advisor.estimate.deltas import CounterTracker, diff_counters
from advisor.sources.metrics import Histogram, MetricsObservation, parse_metrics

BASE = parse_metrics((METRICS / "sglang-0.5.23-tp2.prom").read_text())
BOUNDS = (100.0, 1000.0, float("inf"))


def server_at(requests: float) -> MetricsObservation:
    """The genuine tp2 exposition with its request counters and token histogram set to `requests` served."""
    histogram = Histogram(BOUNDS, (requests * 0.5, requests * 0.9, requests), requests * 300.0, requests)
    return replace(BASE, requests_total=requests, prompt_tokens_total=requests * 300.0,
                   generation_tokens_total=requests * 30.0, prompt_tokens_histogram=histogram)


def counted(deltas) -> float:
    return sum(d.requests or 0.0 for d in deltas)


def test_flipping_between_two_servers_counts_each_servers_growth_once() -> None:
    tracker = CounterTracker()
    a, b = 50_000.0, 5_000.0  # lifetime totals: A served 10x more than B
    tracker.diff(server_at(a), now=0.0)  # the first scrape: lifetime totals (the caller's bootstrap)
    deltas, served = [], 0.0
    for step in range(1, 41):
        if step % 2:
            b += 10
            deltas.append(tracker.diff(server_at(b), now=float(step)))
        else:
            a += 10
            deltas.append(tracker.diff(server_at(a), now=float(step)))
        served += 10
    # only B's first interval is lost (its first scrape is a baseline); nothing is added twice
    assert served - 10 <= counted(deltas) <= served
    assert tracker.restarts_total == 40 and tracker.last_restart_timestamp == 40.0
    assert all(d.restarted for d in deltas)
    # pairwise diffs (what a plain "decrease means restart" rule does) re-add B's lifetime at every flip
    pairwise, previous = [], server_at(50_000.0)
    a, b = 50_000.0, 5_000.0
    for step in range(1, 41):
        if step % 2:
            b += 10
            current = server_at(b)
        else:
            a += 10
            current = server_at(a)
        pairwise.append(diff_counters(previous, current))
        previous = current
    assert counted(pairwise) > 10 * served


def test_a_counter_dipping_once_is_not_a_flood_of_lifetime_totals() -> None:
    tracker = CounterTracker()
    total, deltas = 100_000.0, []
    tracker.diff(server_at(total))
    for step in range(20):
        total += 10
        observed = total - 15 if step == 7 else total  # one process's share vanished for one scrape
        deltas.append(tracker.diff(server_at(observed), now=float(step)))
    # the dip's scrape is a baseline and the recovery counts from the dipped value: off by the dip's depth at
    # most, never by the 100k lifetime total
    assert 200 - 20 <= counted(deltas) <= 200 + 15
    assert tracker.restarts_total == 1
    assert tracker.last_restart_reason is not None and "went down" in tracker.last_restart_reason


def test_genuine_restart_is_counted_once_and_growth_resumes() -> None:
    tracker = CounterTracker()
    tracker.diff(server_at(2_000.0))
    assert counted([tracker.diff(server_at(2_010.0))]) == 10
    restart = tracker.diff(server_at(4.0), now=100.0)  # counters from 0: a new process
    assert restart.restarted and restart.requests == 0.0 and restart.prompt_tokens_histogram.count == 0.0
    assert tracker.restarts_total == 1 and tracker.last_restart_timestamp == 100.0
    deltas = [tracker.diff(server_at(4.0 + 300.0 * i)) for i in range(1, 20)]  # overtakes 2010 by scrape 7
    assert counted(deltas) == 300.0 * 19
    assert tracker.restarts_total == 1  # overtaking the old server's totals is not a switch back to it


def test_steady_server_is_plain_diffs() -> None:
    tracker = CounterTracker()
    first = tracker.diff(server_at(100.0))
    assert first.since_start and first.requests == 100.0
    for i in range(2, 10):
        delta = tracker.diff(server_at(100.0 * i))
        assert not delta.restarted and delta.requests == 100.0
    assert tracker.restarts_total == 0 and tracker.previous is not None
