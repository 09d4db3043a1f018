"""The feeder, table by table: source dataclasses in, estimator and recommender inputs out (no I/O)."""

import json

import pytest
from support import FIXTURES, LOGS, METRICS, REAL, SERVER_INFO

from advisor.errors import InputError
from advisor.estimate.deltas import diff_counters
from advisor.feeder import (
    ByteOverrides,
    constants_from_server_info,
    model_name_of,
    observe_traffic_interval,
    observed_clamp,
    scrape_sample,
    server_model,
    serving_config_of,
)
from advisor.model.advice import free_lever
from advisor.model.pools import GIB
from advisor.model.serving import ServingConfig, slots_per_request
from advisor.sources.bootlog import read_boot_log
from advisor.sources.metrics import parse_metrics
from advisor.sources.server_info import ServerShard, parse_server_info


def _info(name="server_info-tp8-default.json"):
    return parse_server_info(json.loads((SERVER_INFO / name).read_text()))


def _boot():
    return read_boot_log(LOGS / "boot-tp8-default.log")


def _metrics(name="sglang-0.5.23-dp2tp4"):
    return parse_metrics((METRICS / f"{name}.prom").read_text())


def test_server_info_inversion_matches_boot_log():
    constants, rest = constants_from_server_info(_info())
    boot = _boot()
    assert constants.token_equiv == pytest.approx(boot.constants().token_equiv, rel=0.005)
    assert rest == pytest.approx(boot.rest_bytes, rel=0.005)


def test_inversion_refuses_a_pinned_pool_and_an_empty_body():
    info = _info()
    pinned = type(info)(
        serving=ServingConfig(max_mamba_cache_size=100), version=info.version, model_name=info.model_name,
        shards=info.shards,
    )
    assert constants_from_server_info(pinned) is None
    bare = type(info)(serving=info.serving, version=None, model_name=None, shards=[])
    assert constants_from_server_info(bare) is None


def _shard(dp_rank, cap):
    return ServerShard(dp_rank=dp_rank, max_mamba_cache_size=100, effective_max_running_requests=cap,
                       kv_capacity_tokens=1000, kv_cache_gb=1.0, weight_gb=None, startup_available_gb=None)


@pytest.mark.parametrize(
    ("caps", "boot_clamp", "dp_ranks", "expected"),
    [
        ([20, 22], None, 2, 42.0),  # every shard reports: their sum
        ([20, None], 25, 2, 50.0),  # one shard silent: the boot log's per-worker clamp times the DP ranks
        ([], 25, 3, 75.0),
        ([], None, 2, None),
        ([], 25, 0, 25.0),  # no ranks seen yet counts as one worker
    ],
)
def test_observed_clamp(caps, boot_clamp, dp_ranks, expected):
    info = _info()
    info = type(info)(serving=info.serving, version=None, model_name=None,
                      shards=[_shard(i, cap) for i, cap in enumerate(caps)])
    boot = _boot()
    boot.max_running_requests = boot_clamp
    assert observed_clamp(info if caps else None, boot, dp_ranks) == expected


def test_scrape_sample_sums_ranks_and_keeps_a_baseline_free_of_retractions():
    observation = _metrics()
    truth = json.loads((METRICS / "sglang-0.5.23-dp2tp4.truth.json").read_text())
    since_start = diff_counters(None, observation, interval_seconds=None)
    baseline = scrape_sample(observation, since_start, clamp=96.0, log_retractions=7, baseline=True)
    running = sum(rank.running_requests for rank in observation.ranks)
    assert baseline.running_requests == running > 0
    assert baseline.max_running_requests == 96.0
    assert baseline.retracted_requests == 0.0 and baseline.retracted_tokens == 0.0
    counted = scrape_sample(observation, since_start, clamp=None, log_retractions=7, baseline=False)
    assert counted.retracted_requests == sum(rank["retracted_reqs_total"] for rank in truth["ranks"]) > 0
    assert counted.retracted_tokens == sum(
        rank["retracted_input_tokens_total"] + rank["retracted_output_tokens_total"] for rank in truth["ranks"]
    )


def test_the_first_scrape_dates_when_the_server_began_serving_but_a_restored_baseline_does_not():
    from advisor.estimate.traffic import TrafficEstimator

    observation = _metrics()
    since_start = diff_counters(None, observation, interval_seconds=None)
    sample = scrape_sample(observation, since_start, clamp=96.0, log_retractions=0, baseline=True)
    traffic = TrafficEstimator()
    observe_traffic_interval(traffic, 100.0, since_start, sample)
    in_system = sample.running_requests + sample.queued_requests
    assert observation.requests_total > 0
    assert traffic.served_at_baseline == (100.0, observation.requests_total + in_system)
    # after the daemon's own restore the lifetime totals were seen before: the date stays the checkpoint's
    observe_traffic_interval(traffic, 500.0, since_start, sample, baseline_only=True)
    assert traffic.served_at_baseline == (100.0, observation.requests_total + in_system)
    assert traffic.last_time == 500.0


def test_scrape_sample_takes_log_retractions_when_metrics_have_none():
    observation = _metrics("sglang-0.5.23-single")
    delta = diff_counters(None, observation, interval_seconds=None)
    stripped = type(delta)(**{**delta.__dict__, "ranks": []})
    sample = scrape_sample(observation, stripped, clamp=None, log_retractions=7, baseline=False)
    assert sample.retracted_requests == 7.0


def test_server_model_trusts_the_operator_then_the_boot_log_then_server_info():
    info, boot = _info(), _boot()
    serving = serving_config_of(info, boot)
    from_info = server_model(serving, info, None, None)
    from_boot = server_model(serving, info, boot, None)
    given = server_model(serving, info, boot, None, ByteOverrides(1e6, 1e3, rest_gib=10))
    assert from_boot.constants == boot.constants() and from_boot.rest_bytes == boot.rest_bytes
    assert from_info.constants.token_equiv == pytest.approx(boot.constants().token_equiv, rel=0.005)
    assert given.constants.token_equiv == pytest.approx(1000.0)
    assert given.rest_bytes == 10 * GIB
    # the clamp: /server_info's shard first, and the boot log's memory facts for the free lever
    assert from_boot.observed_max_running_requests == info.shards[0].effective_max_running_requests
    assert from_boot.memory.idle_after_pools_gib == boot.memory_pool_end_avail_gib
    assert from_info.memory.idle_after_pools_gib is None


def test_server_model_reads_the_context_length_from_metrics():
    observation = _metrics("sglang-0.5.23-single")
    model = server_model(ServingConfig(), None, None, observation)
    assert model.model_context_len == int(observation.ranks[0].context_len)
    assert server_model(ServingConfig(), None, None, None).model_context_len == 262144


def test_serving_config_comes_from_the_boot_log_when_server_info_is_missing():
    boot = _boot()
    serving = serving_config_of(None, boot)
    assert serving.tp_size == 8  # SGLang's default is 1: the boot log's args were read
    assert serving.kv_cache_dtype == "fp8_e4m3" and serving.mamba_ssm_dtype == "float32"
    assert serving_config_of(_info(), boot) == _info().serving
    assert serving_config_of(None, None) == ServingConfig()


def test_bad_boot_log_args_are_an_error_naming_the_field():
    boot = _boot()
    boot.server_args = {**boot.server_args, "mamba_radix_cache_strategy": "sideways"}
    with pytest.raises(InputError, match="mamba_radix_cache_strategy"):
        serving_config_of(None, boot)


def test_model_name_prefers_server_info_then_metrics():
    info, observation = _info(), _metrics("sglang-0.5.23-single")
    assert model_name_of(info, observation) == info.model_name
    bare = type(info)(serving=info.serving, version=None, model_name=None, shards=[])
    assert model_name_of(bare, observation) == observation.model_name != ""
    assert model_name_of(None, None) == ""


def test_free_lever_from_the_start_up_gauges_when_no_boot_log_is_followed():
    observation = _metrics("sglang-0.5.23-single")
    rank = observation.ranks[0]
    serving = ServingConfig(mem_fraction_static=0.85)
    model = server_model(serving, None, None, observation, ByteOverrides(1e6, 1e3, rest_gib=30))
    idle = rank.startup_available_memory_gb
    assert model.memory.idle_after_graphs_gib == idle == 61.4
    assert model.memory.card_available_gib == pytest.approx(idle + rank.graph_memory_gb + 30 + rank.weight_memory_gb)
    # 61.4 GiB idle is a lever: the recommendation raises --mem-fraction-static
    mfs, note = free_lever(model.memory)
    assert mfs is not None and mfs > 0.85 and note
    # the boot log, when followed, wins; without mem_fraction_static or pool bytes there is no lever
    assert server_model(serving, None, _boot(), observation).memory.idle_after_pools_gib == _boot().memory_pool_end_avail_gib
    assert free_lever(server_model(ServingConfig(), None, None, observation).memory) == (None, None)


def test_inversion_uses_physical_rows_under_dcp():
    body = json.loads((SERVER_INFO / "server_info-tp8-default.json").read_text())
    plain = constants_from_server_info(parse_server_info(body))
    body["dcp_size"] = 8
    for state in body["internal_states"]:
        state["memory_usage"]["token_capacity"] *= 8  # SGLang reports logical tokens (rows x dcp) under DCP
    under_dcp = constants_from_server_info(parse_server_info(body))
    assert under_dcp[0].kv_bytes_per_token == pytest.approx(plain[0].kv_bytes_per_token, rel=1e-6)
    assert under_dcp[0].token_equiv == pytest.approx(plain[0].token_equiv, rel=1e-6)


def test_a_real_0_5_11_boot_log_alone_gives_the_config_that_release_ran():
    boot = read_boot_log(REAL / "011-qwen3.6-27b-awq-v0.5.11-rocm-tp2-full.log")
    serving = serving_config_of(None, boot)
    # 0.5.11 resolved `auto` to no_buffer (its KV line has no dtype:), so S = 3 and the logged clamp 40 // 3
    assert serving.tp_size == 2
    model = server_model(serving, None, boot, None)
    assert model.observed_max_running_requests == 13
    assert slots_per_request(serving) == 3


def test_store_gauges_under_dcp_count_physical_rows():
    # managers/tp_worker.py ~574-576: sglang:max_total_num_tokens is logical (rows x dcp) under DCP; the KV GB
    # hold physical rows, so bytes per token divide by tokens // dcp (kimi-linear-dcp2 sizing fixture)
    from advisor.sources.fleet_queries import server_info_from_gauges
    from advisor.sources.metrics import MetricsObservation, RankMetrics

    body = json.loads((FIXTURES / "sizing" / "kimi-linear-dcp2.server_info.json").read_text())
    shard = body["internal_states"][0]
    rank = RankMetrics(dp_rank=0, kv_capacity_tokens=shard["memory_usage"]["token_capacity"],
                       state_pool_slots=shard["max_mamba_cache_size"], kv_cache_memory_gb=shard["memory_usage"]["kvcache"])
    stand_in = server_info_from_gauges(MetricsObservation(ranks=[rank]), serving=ServingConfig(dcp_size=2))
    constants, _ = constants_from_server_info(stand_in)
    boot = read_boot_log(FIXTURES / "sizing" / "kimi-linear-dcp2.log")
    assert constants.kv_bytes_per_token == pytest.approx(boot.constants().kv_bytes_per_token, rel=0.001)
    assert constants.state_bytes_per_slot == pytest.approx(boot.constants().state_bytes_per_slot, rel=0.01)


def test_the_replays_scheduler_keeps_the_servers_radix_cache_and_admission_budgets():
    """The what-if replay must cache conversation prefixes as the server does (radix on unless disabled) and
    admit with the server's own prefill budgets and conservativeness."""
    from advisor.feeder import scheduler_server
    from advisor.scheduler.costmodel import CostModel

    info, boot = _info(), _boot()
    model = server_model(serving_config_of(info, boot), info, boot, None)
    boot.server_args.update(max_prefill_tokens=32768, schedule_conservativeness=0.5)
    server = scheduler_server(model, boot, CostModel())
    assert server is not None and server.enable_radix_prefix_reuse
    assert server.max_prefill_tokens == 32768 and server.schedule_conservativeness == 0.5
    assert server.chunked_prefill_size == boot.chunked_prefill_size
    boot.server_args.update(max_prefill_tokens="lots", schedule_conservativeness=-1)
    fallback = scheduler_server(model, boot, CostModel())
    assert fallback is not None and fallback.max_prefill_tokens == max(16384, boot.chunked_prefill_size)
    assert fallback.schedule_conservativeness == 1.0


def test_without_a_boot_block_the_replays_admission_knobs_come_from_server_info():
    """An advisor that attached after the boot follows no boot block: the chunk size, prefill budget and
    conservativeness come from /server_info (the live server's; they win over an older boot's), not SGLang's
    defaults (a ROCm or small-GPU server chunks at 2048, a large one at 16384)."""
    import dataclasses

    from advisor.feeder import scheduler_server
    from advisor.scheduler.costmodel import CostModel

    info, boot = _info(), _boot()
    model = server_model(serving_config_of(info, boot), info, boot, None)
    shown = dataclasses.replace(info, chunked_prefill_size=2048, max_prefill_tokens=4096, schedule_conservativeness=0.7)
    server = scheduler_server(model, None, CostModel(), shown)
    assert server is not None
    assert (server.chunked_prefill_size, server.max_prefill_tokens, server.schedule_conservativeness) == (2048, 4096, 0.7)
    assert scheduler_server(model, boot, CostModel(), shown).chunked_prefill_size == 2048
    bare = scheduler_server(model, None, CostModel(), info)
    assert bare is not None and bare.chunked_prefill_size == info.chunked_prefill_size == 8192  # as the body shows
    unchunked = scheduler_server(model, None, CostModel(), dataclasses.replace(info, chunked_prefill_size=0))
    assert unchunked is not None and unchunked.chunked_prefill_size == model.model_context_len


def test_the_decode_lines_give_the_servers_own_prefill_and_decode_costs():
    """Lines the scheduler model prints as SGLang does, read back (a follower's reads cut the intervals anywhere):
    `gen throughput` counts every step since the previous decode line, so its mean batch lies between the two
    lines'; with that the fit finds both the decode and the prefill costs of a one-GPU MoE (the prefill share of
    the time is small, so a biased batch read shows up there first)."""
    from advisor.estimate.steptime import StepTimeEstimator
    from advisor.feeder import step_samples_from_log
    from advisor.scheduler.engine import Simulator
    from advisor.scheduler.types import DecodeTick, PrefillBatch
    from advisor.sim.config import load_server_config
    from advisor.sim.sglang_logs import decode_line, line, prefill_line
    from advisor.sim.workload import load_workload
    from advisor.sources.loglines import LogLineParser, digest

    server = load_server_config("single-gpu-moe")
    workload = load_workload("bimodal-chat-docs").scaled(0.25)
    events = Simulator(server, workload, seed=3).advance(1800)
    text = [line(1.8e9 + e.time, prefill_line(e) if isinstance(e, PrefillBatch) else decode_line(e))
            for e in events if isinstance(e, (PrefillBatch, DecodeTick))]
    parser, carry = LogLineParser(), {}
    intervals = []
    for start in range(0, len(text), 997):  # reads that cut intervals
        intervals += digest(parser.feed(text[start:start + 997]), source="test", carry=carry).decode_intervals
    assert sum(i.prefill_batches for i in intervals) == pytest.approx(
        sum(isinstance(e, PrefillBatch) for e in events), abs=5)  # the prefills before the last decode line
    estimator = StepTimeEstimator()
    estimator.observe(1800.0, step_samples_from_log(intervals))
    fit = estimator.fit()
    assert fit is not None
    for name in ("decode_base_seconds", "decode_per_request_seconds", "decode_per_kv_token_seconds",
                 "prefill_per_token_seconds"):
        assert getattr(fit.cost, name) == pytest.approx(getattr(server.cost, name), rel=0.12), name
    # a batch's fixed cost is the least determined (few prefills per interval): within 40%, where the current
    # line's batch alone (no mean with the previous line's) reads it at nearly twice the server's
    assert fit.cost.prefill_base_seconds == pytest.approx(server.cost.prefill_base_seconds, rel=0.4)


def test_the_gauges_step_samples_carry_the_scrape_intervals_prefills():
    """From /metrics alone, a rank's sample carries the prefills its decode line's interval held: its share of the
    requests that finished plus its batch's growth, at the interval's mean uncached prompt, per decode step its
    share of the generated tokens took; a scrape with no interval behind it gives none."""
    from advisor.estimate.deltas import diff_counters
    from advisor.feeder import step_samples_from_metrics
    from advisor.sources.metrics import MetricsObservation, RankMetrics

    def scrape(running: tuple[int, int], requests: float, prompt: float, cached: float, generated: float):
        ranks = [RankMetrics(dp_rank=i, running_requests=n, gen_throughput=n / 0.025, kv_used_tokens=1e5)
                 for i, n in enumerate(running)]
        return MetricsObservation(ranks=ranks, requests_total=requests, prompt_tokens_total=prompt,
                                  cached_tokens_total=cached, generation_tokens_total=generated)

    before = scrape((40, 50), 1000, 1.0e6, 2.0e5, 3.0e5)
    # 20 s: 100 requests finished (120,000 prompt tokens, 20,000 cached), 40,000 tokens generated over two ranks
    after = scrape((50, 50), 1100, 1.12e6, 2.2e5, 3.4e5)
    assert step_samples_from_metrics(after, diff_counters(None, after), None) == []  # no interval behind it
    samples = step_samples_from_metrics(after, diff_counters(before, after, interval_seconds=20.0), before, steps=40)
    grown, steady = samples
    # rank 0 admitted 50 + 10, over 20,000 / 50 = 400 decode steps; rank 1 admitted 50 over as many
    assert grown.prefill_batches == pytest.approx(60 / 400 * 40)
    assert steady.prefill_batches == pytest.approx(50 / 400 * 40)
    assert grown.prefill_tokens == pytest.approx(grown.prefill_batches * 1000)  # (120,000 - 20,000) / 100
    assert not grown.prefill_read and grown.steps == 40 and grown.batch == 50


def test_the_decode_log_interval_is_the_servers_own_from_server_info_else_the_boot_log():
    import dataclasses

    from advisor.feeder import DEFAULT_DECODE_LOG_INTERVAL, chunked_prefill_size_of, decode_log_interval_of

    info, boot = _info(), _boot()
    assert decode_log_interval_of(dataclasses.replace(info, decode_log_interval=100), boot) == 100
    boot.server_args["decode_log_interval"] = 60
    assert decode_log_interval_of(dataclasses.replace(info, decode_log_interval=None), boot) == 60
    for unreadable in ("often", True, 0):
        boot.server_args["decode_log_interval"] = unreadable
        assert decode_log_interval_of(None, boot) == DEFAULT_DECODE_LOG_INTERVAL
    assert decode_log_interval_of(None, None) == DEFAULT_DECODE_LOG_INTERVAL
    # the chunk: /server_info's, chunking off (0) included, else the boot log's
    assert chunked_prefill_size_of(dataclasses.replace(info, chunked_prefill_size=0), boot) == 0
    assert chunked_prefill_size_of(dataclasses.replace(info, chunked_prefill_size=None), boot) == boot.chunked_prefill_size
    assert chunked_prefill_size_of(None, None) is None


def test_a_request_logs_sampling_params_reach_the_replayed_requests():
    """At SGLang's default --log-requests-level (2) each finished request shows its client's max_new_tokens, which
    admission reserves up to (clipped) for every running request: the replay keeps it; a request that showed none
    (level 0, or a client that left it unset) is replayed as unset."""
    from advisor.estimate.traffic import UNSET_MAX_NEW_TOKENS, TrafficEstimator, TrafficSettings
    from advisor.feeder import exact_requests
    from advisor.sources.loglines import LogLineParser, RequestRecord

    def line(index: int, max_new: str | None) -> str:
        params = "" if max_new is None else f', "sampling_params": {{"max_new_tokens": {max_new}}}'
        stamp = f"2026-11-29T15:{index // 60:02d}:{index % 60:02d}"
        return (f'[2026-11-29 15:00:00] {{"timestamp": "{stamp}", "event": "request.finished", "rid": "r{index}", '
                f'"obj": {{"rid": "r{index}"{params}}}, "out": {{"meta_info": {{"prompt_tokens": 900, '
                f'"completion_tokens": 200, "cached_tokens": 0, "e2e_latency": 2.0}}}}}}')

    caps = ["1024", "null", None]
    records = [event for event in LogLineParser().feed([line(i, caps[i % 3]) for i in range(1500)])
               if isinstance(event, RequestRecord)]
    assert len(records) == 1500
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1800.0))
    traffic.observe_requests(exact_requests(records))
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    assert sorted({request.max_new_tokens for request in picture.requests}) == [1024, UNSET_MAX_NEW_TOKENS]
    assert sum(request.max_new_tokens == 1024 for request in picture.requests) == pytest.approx(
        len(picture.requests) / 3, abs=2)
