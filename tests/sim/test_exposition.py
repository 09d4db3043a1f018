"""The `/metrics` renderer against the genuine SGLang 0.5.23 fixtures: same families, types, HELP texts,
buckets and label-name sets for the same TP/DP shape; values fed from each fixture's truth.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor.model.serving import ServingConfig
from advisor.scheduler.types import RequestFinished, SimSnapshot
from advisor.sim.exposition import (
    OBSERVED_ONLY_FAMILIES,
    TOKEN_BUCKETS_OLD,
    Histogram,
    Layout,
    ServerConstants,
    TokenizerStats,
    WorkerView,
    render_metrics,
    scheduler_ranks,
)

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
SHAPES = {"single": (1, 1), "tp2": (2, 1), "dp2tp4": (4, 2)}


def snapshot_from_truth(rank: dict) -> SimSnapshot:
    return SimSnapshot(
        time=100.0,
        kv_capacity_tokens=rank["kv_tokens"],
        max_mamba_cache_size=rank["mamba_size"],
        max_running_requests=51,
        page_size=1,
        running_requests=rank["running"],
        queued_requests=rank["queue"],
        kv_used_tokens=rank["kv_used"],
        kv_evictable_tokens=rank["kv_evict"],
        mamba_used_slots=rank["mamba_used"],
        mamba_evictable_slots=rank["mamba_evict"],
        decode_sum_seq_lens=rank["sum_seq"],
        new_token_ratio=0.0,
        gen_throughput=5123.4,
        cache_hit_rate=0.31,
        requests_total=0,
        aborted_requests_total=0,
        prompt_tokens_total=0,
        generation_tokens_total=0,
        cached_tokens_total=0,
        retracted_requests_total=rank["retracted_reqs_total"],
        retracted_input_tokens_total=rank["retracted_input_tokens_total"],
        retracted_output_tokens_total=rank["retracted_output_tokens_total"],
        decode_tokens_total=0,
        prefill_compute_tokens_total=0,
    )


def finished(i: int, prompt: int, completion: int, cached: int = 0, retractions: int = 0) -> RequestFinished:
    return RequestFinished(
        time=float(i), rid=f"{i:032x}", prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
        num_retractions=retractions, queue_time=0.5, e2e_latency=3.0, max_new_tokens=4096,
    )  # fmt: skip


def render_shape(name: str, profile: str = "0.5.23", tokenizer: TokenizerStats | None = None) -> str:
    truth = json.loads((METRICS / f"sglang-0.5.23-{name}.truth.json").read_text())
    tp, dp = SHAPES[name]
    layout = Layout(truth["scenario"]["model"], scheduler_ranks(ServingConfig(tp_size=tp, dp_size=dp)), profile=profile)
    views = [WorkerView(snapshot_from_truth(r), snapshot_from_truth(r), last_retracted_reqs=2) for r in truth["ranks"]]
    if tokenizer is None:
        tokenizer = TokenizerStats(profile)
        for i in range(40):
            tokenizer.observe(finished(i, prompt=500 + 997 * i, completion=100 + i, cached=i % 3 * 50))
    consts = ServerConstants(262144, truth["ranks"][0]["kv_gb"], 38.2, 61.4, 1.7, 0.4)
    return render_metrics(layout, views, tokenizer, consts)


def shape_of(text: str) -> dict[str, tuple[str, str, frozenset[frozenset[str]]]]:
    return {
        fam.name: (fam.type, fam.documentation, frozenset(frozenset(s.labels) for s in fam.samples))
        for fam in text_string_to_metric_families(text)
    }


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("pid", "model_name")))
            out[(s.name, labels)] = s.value
    return out


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_families_types_help_and_label_names_match_the_fixture(name):
    fixture = shape_of((METRICS / f"sglang-0.5.23-{name}.prom").read_text())
    emulated = shape_of(render_shape(name))
    assert set(fixture) - set(emulated) == set()
    # the only extras are families real SGLang creates on first observation (fixtures made without them)
    assert set(emulated) - set(fixture) <= OBSERVED_ONLY_FAMILIES
    for family, (kind, help_text, label_sets) in fixture.items():
        assert emulated[family] == (kind, help_text, label_sets), family


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_fixture_series_exists_with_the_same_rank_spread(name):
    fixture = samples((METRICS / f"sglang-0.5.23-{name}.prom").read_text())
    emulated = samples(render_shape(name))
    assert set(fixture) <= set(emulated)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_pool_gauges_and_retraction_counters_carry_the_truth_values(name):
    truth = json.loads((METRICS / f"sglang-0.5.23-{name}.truth.json").read_text())
    fixture = samples((METRICS / f"sglang-0.5.23-{name}.prom").read_text())
    emulated = samples(render_shape(name))
    families = (
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:decode_sum_seq_lens", "sglang:kv_used_tokens",
        "sglang:kv_available_tokens", "sglang:kv_evictable_tokens", "sglang:mamba_used_tokens",
        "sglang:mamba_available_tokens", "sglang:mamba_evictable_tokens", "sglang:num_used_tokens",
        "sglang:max_total_num_tokens", "sglang:num_pages", "sglang:num_retracted_requests_total",
        "sglang:num_retracted_input_tokens_total", "sglang:num_retracted_output_tokens_total",
        "sglang:kv_cache_memory_usage_gb", "sglang:num_retracted_reqs",
    )  # fmt: skip
    checked = 0
    for key, value in fixture.items():
        if key[0] in families:
            assert emulated[key] == pytest.approx(value), key
            checked += 1
        elif key[0] in ("sglang:token_usage", "sglang:full_token_usage", "sglang:mamba_usage"):
            assert emulated[key] == pytest.approx(value, abs=0.005), key  # the fixture fed 2-decimal usages
            checked += 1
    # retraction counters on every TP rank of every DP rank, periodic gauges once per DP rank
    tp, dp = SHAPES[name]
    assert checked == len(truth["ranks"]) * (11 + 3) + dp * tp * 6


def test_histograms_accumulate_bucket_counts_not_samples():
    stats = TokenizerStats()
    lengths = [50, 100, 101, 7000, 2_000_000]
    for i, length in enumerate(lengths):
        stats.observe(finished(i, prompt=length, completion=10, cached=min(length, 60)))
    text = render_shape("single", tokenizer=stats)
    got = samples(text)
    base = (("engine_type", "unified"),)
    bucket = "sglang:prompt_tokens_histogram_bucket"
    assert got[(bucket, tuple(sorted(base + (("le", "100.0"),))))] == 2
    assert got[(bucket, tuple(sorted(base + (("le", "300.0"),))))] == 3
    assert got[(bucket, tuple(sorted(base + (("le", "7000.0"),))))] == 4
    assert got[(bucket, tuple(sorted(base + (("le", "1.1e+06"),))))] == 4
    assert got[(bucket, tuple(sorted(base + (("le", "+Inf"),))))] == 5
    assert got[("sglang:prompt_tokens_histogram_sum", base)] == sum(lengths)
    assert got[("sglang:uncached_prompt_tokens_histogram_sum", base)] == sum(max(n - min(n, 60), 0) for n in lengths)
    streamed = sum(v for (n, _), v in got.items() if n == "sglang:num_requests_total")
    assert streamed == len(lengths)
    assert len(stats.prompt_hist.counts) == 36  # fixed size, whatever the number of requests


def test_tokenizer_families_appear_only_after_the_first_finished_request():
    fams = shape_of(render_shape("single", tokenizer=TokenizerStats()))
    assert "sglang:num_requests" not in fams and "sglang:prompt_tokens_histogram" not in fams
    assert "sglang:num_running_reqs" in fams


def test_aborted_and_queue_time_families_appear_when_observed():
    stats = TokenizerStats()
    event = finished(1, 100, 0)
    stats.observe(RequestFinished(**{**event.__dict__, "aborted": True}))
    truth = json.loads((METRICS / "sglang-0.5.23-tp2.truth.json").read_text())
    queue = Histogram([0.0, 1.0, 10.0])
    queue.observe(0.5)
    view = WorkerView(snapshot_from_truth(truth["ranks"][0]), snapshot_from_truth(truth["ranks"][0]), queue_time=queue)
    layout = Layout("m", scheduler_ranks(ServingConfig(tp_size=2)))
    text = render_metrics(layout, [view], stats, ServerConstants(262144, 15.0, 38.0, 61.0, 1.7, 0.4))
    got = samples(text)
    assert got[("sglang:num_aborted_requests_total", (("engine_type", "unified"),))] == 1
    # queue time is a scheduler histogram: one series per TP rank
    for tp in ("0", "1"):
        key = ("sglang:queue_time_seconds_count", (("engine_type", "unified"), ("moe_ep_rank", "0"), ("pp_rank", "0"), ("tp_rank", tp)))
        assert got[key] == 1


def test_priority_and_dp_attention_labels():
    serving = ServingConfig(tp_size=4, dp_size=2, attn_dp_size=2)
    ranks = scheduler_ranks(serving)
    assert [(r.dp_rank, r.tp_rank, r.is_stats_rank) for r in ranks] == [
        (0, 0, True), (0, 1, False), (1, 2, True), (1, 3, False),
    ]  # fmt: skip
    truth = json.loads((METRICS / "sglang-0.5.23-dp2tp4.truth.json").read_text())
    views = [WorkerView(snapshot_from_truth(r), snapshot_from_truth(r)) for r in truth["ranks"]]
    layout = Layout("m", ranks, priority_scheduling=True)
    stats = TokenizerStats()
    stats.observe(finished(1, 100, 10))
    fams = shape_of(render_metrics(layout, views, stats, ServerConstants(262144, 15.0, 38.0, 61.0, 1.7, 0.4)))
    assert frozenset({"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "priority"}) in fams[
        "sglang:num_running_reqs"
    ][2]
    assert frozenset({"model_name", "engine_type", "priority", "is_streaming"}) in fams["sglang:num_requests"][2]


def test_profile_0510_drops_the_newer_families_and_uses_old_buckets():
    stats = TokenizerStats("0.5.10", collect_tokens_histogram=True)
    stats.observe(finished(1, 50_000, 10, retractions=2))
    text = render_shape("tp2", profile="0.5.10", tokenizer=stats)
    fams = shape_of(text)
    for gone in ("sglang:kv_used_tokens", "sglang:mamba_used_tokens", "sglang:mamba_available_tokens",
                 "sglang:page_size", "sglang:num_pages", "sglang:context_len", "sglang:kv_cache_memory_usage_gb",
                 "sglang:uncached_prompt_tokens_histogram", "sglang:spec_num_steps"):  # fmt: skip
        assert gone not in fams, gone
    for kept in ("sglang:num_running_reqs", "sglang:mamba_usage", "sglang:full_token_usage",
                 "sglang:num_retracted_requests", "sglang:max_total_num_tokens", "sglang:new_token_ratio",
                 "sglang:decode_sum_seq_lens", "sglang:num_retractions"):  # fmt: skip
        assert kept in fams, kept
    # no engine_type and no is_streaming on tokenizer metrics; max_total_num_tokens only on the stats rank
    assert fams["sglang:num_requests"][2] == {frozenset({"model_name"})}
    assert {dict(s.labels)["tp_rank"] for f in text_string_to_metric_families(text)
            if f.name == "sglang:max_total_num_tokens" for s in f.samples} == {"0"}  # fmt: skip
    les = [s.labels["le"] for f in text_string_to_metric_families(text)
           if f.name == "sglang:prompt_tokens_histogram" for s in f.samples if "le" in s.labels]  # fmt: skip
    assert len(les) == len(TOKEN_BUCKETS_OLD) + 1 and "66000.0" in les


def test_profile_0510_without_collect_tokens_histogram_has_no_token_histograms():
    stats = TokenizerStats("0.5.10")
    stats.observe(finished(1, 500, 10))
    fams = shape_of(render_shape("single", profile="0.5.10", tokenizer=stats))
    assert "sglang:prompt_tokens_histogram" not in fams and "sglang:generation_tokens_histogram" not in fams
    assert "sglang:prompt_tokens" in fams


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="version profile"):
        TokenizerStats("0.4.0")
