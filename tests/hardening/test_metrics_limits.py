"""Caps on a /metrics exposition (line length, labels per series, series per scrape) and bounded memory when a
target's label sets change every scrape."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from support import METRICS

from advisor.errors import InputError, LimitExceeded
from advisor.sources.metrics import MetricsLimitExceeded, MetricsLimits, parse_metrics

GENUINE = (METRICS / "sglang-0.5.23-dp2tp4.prom").read_text()


def test_genuine_exposition_is_within_the_default_caps() -> None:
    observation = parse_metrics(GENUINE)
    assert len(observation.ranks) == 2


def test_a_giant_line_is_a_named_limit_error() -> None:
    text = GENUINE + "# HELP padding " + "x" * 5000 + "\n"
    with pytest.raises(MetricsLimitExceeded, match="max_line_bytes=4096") as err:
        parse_metrics(text, MetricsLimits(max_line_bytes=4096))
    assert isinstance(err.value, LimitExceeded) and isinstance(err.value, InputError)


def test_too_many_labels_is_a_named_limit_error() -> None:
    labels = ",".join(f'l{i}="v"' for i in range(70))
    text = f"sglang:num_running_reqs{{{labels}}} 1.0\n"
    with pytest.raises(MetricsLimitExceeded, match="70 labels on sglang:num_running_reqs, more than max_labels_per_series=64"):
        parse_metrics(text)
    assert parse_metrics(text, MetricsLimits(max_labels_per_series=70)).ranks[0].running_requests == 1


def test_too_many_series_is_a_named_limit_error() -> None:
    text = "".join(f'sglang:num_running_reqs{{dp_rank="{i}",tp_rank="0"}} 1.0\n' for i in range(1000))
    with pytest.raises(MetricsLimitExceeded, match="max_series=500"):
        parse_metrics(text, MetricsLimits(max_series=500))
    assert len(parse_metrics(text).ranks) == 1000


def _churning_exposition(scrape: int, series: int = 300, value_chars: int = 3000) -> str:
    """Label sets that never repeat across scrapes, each ~3 KB (a request id or a hash in a label)."""
    lines = []
    for i in range(series):
        junk = f"{scrape}-{i}-".ljust(value_chars, "z")
        lines.append(f'sglang:num_requests_total{{model_name="m",request_id="{junk}"}} {i}.0\n')
    return "".join(lines)


def test_label_churn_does_not_grow_memory() -> None:
    for scrape in range(5):  # warm up whatever is warmed up
        parse_metrics(_churning_exposition(scrape))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for scrape in range(5, 45):
            parse_metrics(_churning_exposition(scrape))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 40 scrapes x 300 new ~3 KB label sets = 36 MB if they were kept; the cache keeps none of them.
    assert grown < 4 << 20, f"parser memory grew by {grown / 1e6:.1f} MB over 40 churning scrapes"
