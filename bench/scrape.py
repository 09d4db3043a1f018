"""Scrape-parse cost: our /metrics parser + diff_counters vs prometheus_client's parser, on SGLang's own bodies.

prometheus_client materialises every sample of every family; ours reads only the pool families. Both run in
the same process on the same text. "warm" is the daemon's steady state (label sets repeat scrape after scrape
and their parse is cached); "cold" clears that cache before every parse.

    python bench/scrape.py            # the table
    python bench/scrape.py --runs 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from advisor.estimate.deltas import diff_counters
from advisor.sources import metrics
from advisor.sources.metrics import parse_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics"
FILES = ("sglang-0.5.23-tp2.prom", "sglang-0.5.23-dp2tp4.prom")


def median_ms(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per figure (median reported)")
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (wall-clock medians on a shared box)"
    )
    print(f"{'exposition':28} {'KB':>5} {'lines':>6} {'ours warm ms':>12} {'ours cold ms':>12} "
          f"{'prom_client ms':>14} {'speed-up warm':>13} {'cold':>6}")  # fmt: skip
    for name in FILES:
        text = (FIXTURES / name).read_text()
        previous = parse_metrics(text)

        def ours_warm(text: str = text, previous: metrics.MetricsObservation = previous) -> object:
            return diff_counters(previous, parse_metrics(text), interval_seconds=15.0)

        def ours_cold(text: str = text, previous: metrics.MetricsObservation = previous) -> object:
            metrics._SERIES_CACHE.clear()
            return diff_counters(previous, parse_metrics(text), interval_seconds=15.0)

        def reference(text: str = text) -> object:
            return [sample for family in text_string_to_metric_families(text) for sample in family.samples]

        warm = median_ms(ours_warm, args.runs)
        cold = median_ms(ours_cold, args.runs)
        theirs = median_ms(reference, args.runs)
        print(f"{name:28} {len(text) / 1024:5.0f} {text.count(chr(10)):6d} {warm:12.3f} {cold:12.3f} "
              f"{theirs:14.3f} {theirs / warm:12.1f}x {theirs / cold:5.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
