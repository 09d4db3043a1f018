"""Golden tests of the /metrics parser on SGLang 0.5.23's genuine expositions, plus label rules and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor.errors import InputError
from advisor.sources.metrics import MetricsParseError, parse_metrics

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
SCENARIOS = ("single", "tp2", "dp2tp4")


def _load(name: str) -> tuple[str, dict]:
    text = (METRICS / f"sglang-0.5.23-{name}.prom").read_text()
    truth = json.loads((METRICS / f"sglang-0.5.23-{name}.truth.json").read_text())
    return text, truth


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_truth_number_is_reproduced(name: str) -> None:
    text, truth = _load(name)
    observation = parse_metrics(text)
    assert [rank.dp_rank for rank in observation.ranks] == [rank["dp_rank"] for rank in truth["ranks"]]
    for rank, expected in zip(observation.ranks, truth["ranks"], strict=True):
        assert rank.running_requests == expected["running"]
        assert rank.queued_requests == expected["queue"]
        assert rank.kv_capacity_tokens == expected["kv_tokens"]
        assert rank.kv_cache_memory_gb == pytest.approx(expected["kv_gb"])
        assert rank.state_pool_slots == expected["mamba_size"]
        assert rank.decode_sum_seq_lens == expected["sum_seq"]
        assert rank.kv_used_tokens == expected["kv_used"]
        assert rank.kv_evictable_tokens == expected["kv_evict"]
        assert rank.state_slots_used == expected["mamba_used"]
        assert rank.state_slots_evictable == expected["mamba_evict"]
        # Written on every TP rank: counted once per DP rank, never xTP.
        assert rank.retracted_requests_total == expected["retracted_reqs_total"]
        assert rank.retracted_input_tokens_total == expected["retracted_input_tokens_total"]
        assert rank.retracted_output_tokens_total == expected["retracted_output_tokens_total"]
        assert (
            rank.kv_used_tokens + rank.kv_available_tokens + rank.kv_evictable_tokens
            == rank.kv_capacity_tokens
        )
    requests = truth["requests"]
    assert observation.requests_total == requests["count"]
    assert observation.prompt_tokens_total == requests["prompt_sum"]
    assert observation.generation_tokens_total == requests["gen_sum"]
    assert (
        observation.prompt_tokens_histogram is not None
        and observation.generation_tokens_histogram is not None
    )
    assert observation.prompt_tokens_histogram.sum == requests["prompt_sum"]
    assert observation.prompt_tokens_histogram.count == requests["count"]
    assert observation.generation_tokens_histogram.sum == requests["gen_sum"]
    mean = (
        observation.prompt_tokens_total + observation.generation_tokens_total
    ) / observation.requests_total
    assert mean == pytest.approx(requests["mean_context"])
    assert observation.model_name == truth["scenario"]["model"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_agrees_with_prometheus_client(name: str) -> None:
    """Cross-check against the reference parser with the same selection rules applied by hand."""
    text, _ = _load(name)
    observation = parse_metrics(text)
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def stats_rank_value(sample_name: str, dp_rank: int | None) -> float:
        matches = [
            s
            for s in samples
            if s.name == sample_name
            and (None if "dp_rank" not in s.labels else int(s.labels["dp_rank"])) == dp_rank
        ]
        return min(matches, key=lambda s: int(s.labels["tp_rank"])).value

    for rank in observation.ranks:
        assert rank.kv_available_tokens == stats_rank_value("sglang:kv_available_tokens", rank.dp_rank)
        assert rank.full_token_usage == stats_rank_value("sglang:full_token_usage", rank.dp_rank)
        assert rank.mamba_usage == stats_rank_value("sglang:mamba_usage", rank.dp_rank)
        assert rank.token_usage == stats_rank_value("sglang:token_usage", rank.dp_rank)
        assert rank.gen_throughput == stats_rank_value("sglang:gen_throughput", rank.dp_rank)
        assert rank.page_size == stats_rank_value("sglang:page_size", rank.dp_rank)
        assert rank.context_len == stats_rank_value("sglang:context_len", rank.dp_rank)
    cached = sum(s.value for s in samples if s.name == "sglang:cached_tokens_total")
    assert observation.cached_tokens_total == cached
    buckets = [s for s in samples if s.name == "sglang:prompt_tokens_histogram_bucket"]
    histogram = observation.prompt_tokens_histogram
    assert histogram is not None
    assert histogram.upper_bounds == tuple(sorted({float(s.labels["le"]) for s in buckets}))
    assert histogram.upper_bounds[-1] == math.inf
    assert histogram.cumulative_counts[-1] == histogram.count
    assert sum(histogram.bucket_counts()) == histogram.count
    assert "sglang:e2e_request_latency_seconds" in observation.families_seen
    assert "sglang:num_retracted_requests_total" in observation.families_seen


def test_tp_copies_are_not_summed() -> None:
    text, truth = _load("dp2tp4")
    tp_size = truth["scenario"]["tp"]
    copies = [line for line in text.splitlines() if line.startswith("sglang:num_retracted_requests_total{")]
    assert len(copies) == tp_size * len(truth["ranks"])  # the fixture really repeats the counter per TP rank
    assert sum(rank.retracted_requests_total or 0 for rank in parse_metrics(text).ranks) == sum(
        rank["retracted_reqs_total"] for rank in truth["ranks"]
    )


def _sched(name: str, value: float, **labels: str) -> str:
    base = {"engine_type": "unified", "model_name": "m", "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
    base.update(labels)
    rendered = ",".join(f'{key}="{val}"' for key, val in sorted(base.items()))
    return f"sglang:{name}{{{rendered}}} {value}\n"


def test_priority_total_is_read_for_scheduler_gauges() -> None:
    text = (
        _sched("num_running_reqs", 30, priority="")
        + _sched("num_running_reqs", 10, priority="1")
        + _sched("num_running_reqs", 20, priority="2")
        + _sched("num_queue_reqs", 4, priority="")
        + _sched("num_queue_reqs", 4, priority="0")
    )
    rank = parse_metrics(text).ranks[0]
    assert (rank.running_requests, rank.queued_requests) == (30, 4)


def test_tokenizer_series_per_priority_and_label_are_disjoint_and_summed() -> None:
    # collect_metrics replaces priority="" by the request's own priority: each request is in one series only.
    lines = []
    for labels, count, total in (
        (('priority=""', 'is_streaming="false"'), 3, 300),
        (('priority="1"', 'is_streaming="true"'), 2, 50),
    ):
        rendered = ",".join(sorted(labels + ('model_name="m"',)))
        lines.append(f"sglang:num_requests_total{{{rendered}}} {count}\n")
        lines.append(f"sglang:prompt_tokens_total{{{rendered}}} {total}\n")
    observation = parse_metrics("".join(lines))
    assert observation.requests_total == 5
    assert observation.prompt_tokens_total == 350


def test_pid_gauge_takes_the_stats_rank_and_the_max_over_stale_pids() -> None:
    text = (
        _sched("num_retracted_reqs", 0, pid="100")
        + _sched("num_retracted_reqs", 3, pid="200")
        + _sched("num_retracted_reqs", 9, pid="300", tp_rank="1")
    )
    assert parse_metrics(text).ranks[0].last_retracted_requests == 3


def test_lowest_tp_rank_in_each_dp_rank_under_dp_attention() -> None:
    # DP attention: tp_rank runs over the whole group, so DP rank 1's stats rank is tp_rank 4.
    text = (
        _sched("num_running_reqs", 11, dp_rank="0", tp_rank="0")
        + _sched("num_running_reqs", 22, dp_rank="1", tp_rank="4")
        + _sched("num_retracted_requests_total", 5, dp_rank="1", tp_rank="5")
        + _sched("num_retracted_requests_total", 5, dp_rank="1", tp_rank="4")
    )
    ranks = parse_metrics(text).ranks
    assert [(r.dp_rank, r.running_requests, r.retracted_requests_total) for r in ranks] == [
        (0, 11, None),
        (1, 22, 5),
    ]


def test_absent_families_are_none_and_state_pool_needs_all_three() -> None:
    text = _sched("mamba_used_tokens", 5) + _sched("mamba_available_tokens", 7)
    rank = parse_metrics(text).ranks[0]
    assert rank.state_slots_used == 5 and rank.state_pool_slots is None and rank.kv_used_tokens is None
    observation = parse_metrics(text)
    assert observation.requests_total is None and observation.prompt_tokens_histogram is None


def test_escaped_label_values() -> None:
    text = 'sglang:num_requests_total{model_name="a \\"quoted\\" \\\\ name",is_streaming="false"} 2\n'
    observation = parse_metrics(text)
    assert observation.model_name == 'a "quoted" \\ name'
    assert observation.requests_total == 2


def test_foreign_families_are_skipped() -> None:
    text = (
        "# HELP python_gc_objects_collected_total Objects collected during gc\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 123.0\n'
        "process_virtual_memory_bytes 1.2e+09\n"
        "sglang:some_future_metric{weird} whatever\n" + _sched("num_running_reqs", 7)
    )
    assert parse_metrics(text).ranks[0].running_requests == 7


def test_truncated_exposition_is_an_error_naming_the_line() -> None:
    text, _ = _load("tp2")
    cut = text[: len(text) // 2]
    assert not cut.endswith("\n")
    with pytest.raises(MetricsParseError, match=r"line \d+: exposition cut mid-line"):
        parse_metrics(cut)


def test_exposition_cut_between_histogram_lines_is_an_error() -> None:
    text, _ = _load("single")
    lines = text.splitlines(keepends=True)
    last_bucket = max(
        i for i, line in enumerate(lines) if line.startswith("sglang:prompt_tokens_histogram_bucket")
    )
    with pytest.raises(MetricsParseError, match=r"prompt_tokens_histogram has no \+Inf bucket"):
        parse_metrics("".join(lines[:last_bucket]))


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", "empty"),
        ("  \n\n", "empty"),
        ("<!DOCTYPE html>\n<html><body>Not Found</body></html>\n", r"line 1: not a Prometheus sample"),
        ('{"detail":"Not Found"}\n', r"line 1: not a Prometheus sample"),
        ("Internal Server Error\n", r"line 1: not a Prometheus sample"),
        ('# TYPE x gauge\nsglang:num_running_reqs{tp_rank="0"} lots\n', r"line 2: value 'lots'"),
        ('sglang:num_running_reqs{tp_rank="0" 3\n', r"line 1: malformed"),
        ("sglang:num_running_reqs{tp_rank=0} 3\n", r"line 1: malformed labels"),
        ('sglang:num_running_reqs{tp_rank="zero"} 3\n', r"line 1: label tp_rank='zero' is not an integer"),
        ('sglang:num_running_reqs{tp_rank="0"} 3 4 5\n', r"line 1: malformed sample"),
    ],
)
def test_garbage_is_one_clear_error(text: str, pattern: str) -> None:
    with pytest.raises(MetricsParseError, match=pattern) as caught:
        parse_metrics(text)
    assert isinstance(caught.value, InputError)
    assert "\n" not in str(caught.value)


def test_scheduler_histogram_counts_one_tp_rank_per_dp_rank() -> None:
    # sglang:queue_time_seconds is observed by each scheduler process: read tp 0 (4) of each DP rank, sum DPs.
    text = "".join(
        _sched("queue_time_seconds_bucket", count * (dp + 1), dp_rank=str(dp), tp_rank=str(tp), le=le)
        for dp, tp in ((0, 0), (0, 1), (1, 4), (1, 5))
        for le, count in (("0.1", 2), ("1.0", 5), ("+Inf", 6))
    ) + "".join(
        _sched(f"queue_time_seconds_{kind}", value * (dp + 1), dp_rank=str(dp), tp_rank=str(tp))
        for dp, tp in ((0, 0), (0, 1), (1, 4), (1, 5))
        for kind, value in (("sum", 3.5), ("count", 6))
    )
    histogram = parse_metrics(text).queue_time_histogram
    assert histogram is not None
    assert histogram.upper_bounds == (0.1, 1.0, math.inf)
    assert histogram.cumulative_counts == (6, 15, 18)
    assert (histogram.sum, histogram.count) == (10.5, 18)
