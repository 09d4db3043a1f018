"""The SGLang dual-pool simulator: pool sizing of the shipped configs, determinism, conservation,
the pool invariants, SGLang's retraction order and ratio, and goodput against r."""

from __future__ import annotations

import dataclasses
import math

import pytest
from support import RESULT_KEYS

from advisor.errors import InputError
from advisor.scheduler.engine import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO_FACTOR,
    RETRACT_DECODE_STEPS,
    Simulator,
    best_result,
    simulate,
    sweep,
)
from advisor.scheduler.types import DecodeTick, PrefillBatch, RequestFinished, Retraction
from advisor.sim.config import load_server_config, parse_bytes, server_config_from_dict
from advisor.sim.workload import RequestSpec, load_workload, workload_from_dict

GIB = 1 << 30

# A toy server: 1000-byte state slots, 1-byte KV tokens, S = 5 (default strategy).
# r = 3.5 of 27000 bytes -> 20 slots (clamp 4) and a 6000-token KV pool.
TINY = {
    "name": "tiny",
    "serving": {"mamba_full_memory_ratio": 3.5},
    "constants": {"state_bytes_per_slot": 1000, "kv_bytes_per_token": 1},
    "rest_bytes": 27000,
}
# Never used to generate: the tiny scenarios pass explicit arrivals.
UNUSED = workload_from_dict(
    {"arrival": {"process": "poisson", "rate": 1}, "classes": [{"input": 100, "output": 10}]}
)


def _chat(rate: float, **extra: object) -> dict:
    return {
        "name": "chat",
        "arrival": {"process": "poisson", "rate": rate},
        "classes": [
            {
                "name": "chat",
                "input": {"median": 1500, "sigma": 0.6},
                "output": {"median": 500, "sigma": 0.5, "max": 2048},
                "max_new_tokens": {"fixed": 2048},
                **extra,
            }
        ],
    }


def _drive(sim: Simulator, until: float, step: float) -> list:
    """Advance in small steps, checking the pool invariants and conservation after each."""
    events: list = []
    finished = 0
    t = 0.0
    while t < until:
        t = min(t + step, until)
        batch = sim.advance(t)
        assert all(e.time <= t + 1e-9 for e in batch)
        assert all(a.time <= b.time + 1e-9 for a, b in zip(batch, batch[1:], strict=False))
        events += batch
        snap = sim.snapshot()
        assert snap.running_requests <= snap.max_running_requests
        assert snap.kv_used_tokens + snap.kv_evictable_tokens <= snap.kv_capacity_tokens
        assert snap.mamba_used_slots + snap.mamba_evictable_slots <= snap.max_mamba_cache_size
        finished += sum(isinstance(e, RequestFinished) for e in batch)
        assert sim.accumulators().arrived == finished + sim.in_system()
    return events


# ------------------------------------------------------------------ configs


def test_default_config_is_the_seed_example_clamped_at_51():
    config = load_server_config("default")
    split = config.split()
    assert config.constants.state_bytes_per_slot == pytest.approx(13.50 * GIB / 258)
    assert config.constants.kv_bytes_per_token == pytest.approx(15.03 * GIB / 1167552)
    assert (split.max_mamba_cache_size, split.max_running_requests) == (257, 51)
    assert split.kv_capacity_tokens == 1167552  # the boot log's #tokens


def test_shipped_configs_reproduce_their_boot_logs():
    single = load_server_config("single-qwen3next").split()
    assert (single.max_mamba_cache_size, single.max_running_requests, single.kv_capacity_tokens) == (
        555,
        138,
        436906,
    )
    dcp = load_server_config("dcp8")
    assert dcp.split().max_running_requests == 90  # seed: DCP8 r = 5.97 -> 451 slots, clamp 90
    assert dcp.with_ratio(9).split().max_running_requests == 94  # r = 9 -> 474, 94
    assert load_server_config("lazy").split().max_running_requests == 257 // 4
    spec = load_server_config("spec").split()
    assert spec.max_running_requests <= 48 and spec.intermediate_bytes > 0


def test_with_ratio_moves_budget_between_pools():
    config = load_server_config("default")
    low, high = config.with_ratio(0.5).split(), config.with_ratio(5).split()
    assert low.max_running_requests < high.max_running_requests
    assert low.kv_capacity_tokens > high.kv_capacity_tokens


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"rest_bytes": "12 GB"}, "rest_bytes"),
        ({"rest_bytes": -3}, "rest_bytes"),
        (
            {"constants": {"state_bytes_per_slot": "x", "kv_bytes_per_token": 1}},
            "constants.state_bytes_per_slot",
        ),
        ({"constants": {"state_bytes_per_slot": 1000}}, "constants.kv_bytes_per_token"),
        ({"serving": {"tp_size": "eight"}}, "serving.tp_size"),
        ({"serving": {"strategy": "huge_buffer"}}, "strategy"),
        ({"serving": {"warp_drive": True}}, "serving.warp_drive"),
        ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
        ({"cost": {"decode_base_seconds": "fast"}}, "cost.decode_base_seconds"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_server_config_errors_name_the_field(patch, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        server_config_from_dict({**TINY, **patch})


def test_parse_bytes_accepts_binary_units_and_divisors():
    assert parse_bytes("13.50 GiB / 258", "x") == pytest.approx(13.5 * GIB / 258)
    assert parse_bytes("512 MiB", "x") == 512 * (1 << 20)
    assert parse_bytes(1234, "x") == 1234


def test_unknown_server_config_is_an_input_error():
    with pytest.raises(InputError, match="neither a file nor a shipped config"):
        load_server_config("no-such-server")


# ------------------------------------------------------------------ determinism and conservation


def test_same_seed_same_run_and_different_seed_differs():
    config = load_server_config("default")
    workload = load_workload("bimodal-chat-docs")
    first = simulate(config, workload, duration=300, seed=7)
    again = simulate(config, workload, duration=300, seed=7)
    other = simulate(config, workload, duration=300, seed=8)
    assert first.to_dict() == again.to_dict()
    assert first.to_dict() != other.to_dict()


def test_events_do_not_depend_on_how_time_is_sliced():
    config = load_server_config("default").with_ratio(20)
    workload = load_workload("heavy-tail-outputs")
    fine = Simulator(config, workload, seed=2)
    coarse = Simulator(config, workload, seed=2)
    fine_events = _drive(fine, 600, 0.37)
    coarse_events = coarse.advance(300) + coarse.advance(600)
    assert [dataclasses.astuple(e) for e in fine_events] == [dataclasses.astuple(e) for e in coarse_events]
    assert fine.snapshot() == coarse.snapshot()


@pytest.mark.parametrize(
    ("workload", "config", "ratio"),
    [
        ("bimodal-chat-docs", "default", 8.0),
        ("heavy-tail-outputs", "default", 25.0),
        ("doc-bursts", "lazy", 6.0),
        ("spec-decode", "spec", 3.0),
        ("dcp", "dcp8", 20.0),
        ("regime-shift", "single-qwen3next", 4.0),
    ],
)
def test_invariants_hold_and_every_request_is_accounted_for(workload, config, ratio):
    sim = Simulator(load_server_config(config).with_ratio(ratio), load_workload(workload), seed=5)
    events = _drive(sim, 600, 1.3)
    # every arrival up to now has been seen (queued, running, finished or refused)
    assert sim.accumulators().arrived == len(load_workload(workload).requests(5, 600))
    assert any(isinstance(e, RequestFinished) for e in events)
    assert any(isinstance(e, PrefillBatch) for e in events)
    assert any(isinstance(e, DecodeTick) for e in events)


def test_radix_prefix_reuse_caches_shared_prefixes_within_the_pool():
    workload = workload_from_dict(
        {
            "arrival": {"process": "poisson", "rate": 4},
            "classes": [
                {
                    "name": "agent",
                    "input": {"median": 6000, "sigma": 0.3},
                    "output": {"median": 300, "sigma": 0.5},
                    "prefix": {"groups": 4, "tokens": 4000},
                }
            ],
        }
    )
    base = load_server_config("default").with_ratio(20)
    plain = Simulator(dataclasses.replace(base, enable_radix_prefix_reuse=False), workload, seed=1)
    radix = Simulator(dataclasses.replace(base, enable_radix_prefix_reuse=True), workload, seed=1)
    _drive(plain, 300, 2.0)
    events = _drive(radix, 300, 2.0)
    assert plain.snapshot().cached_tokens_total == 0
    snap = radix.snapshot()
    assert snap.cache_hit_rate > 0.3
    assert snap.prefill_compute_tokens_total < plain.snapshot().prefill_compute_tokens_total
    assert any(e.cached_tokens > 0 for e in events if isinstance(e, RequestFinished))


def test_simulate_with_dp_runs_one_worker_per_dp_rank():
    base = load_server_config("default")
    workload = load_workload("steady-chat")
    dp2 = dataclasses.replace(base, serving=dataclasses.replace(base.serving, dp_size=2))
    single = simulate(base, workload, duration=300, seed=1)
    double = simulate(dp2, workload, duration=300, seed=1)
    assert double.dp_size == 2 and double.arrived_requests == single.arrived_requests
    assert double.max_running_requests == single.max_running_requests  # the clamp is per worker
    assert double.goodput_tokens_per_second > single.goodput_tokens_per_second


def test_dp_workers_split_the_arrivals_round_robin():
    config = load_server_config("default")
    workload = load_workload("steady-chat")
    whole = Simulator(config, workload, seed=3)
    halves = [Simulator(config, workload, seed=3, dp_rank=rank, dp_size=2) for rank in (0, 1)]
    for sim in (whole, *halves):
        sim.advance(120)
    arrived = [h.accumulators().arrived for h in halves]
    assert sum(arrived) == whole.accumulators().arrived
    assert abs(arrived[0] - arrived[1]) <= 1
    with pytest.raises(ValueError):
        Simulator(config, workload, dp_rank=2, dp_size=2)


# ------------------------------------------------------------------ SGLang's scheduling rules


def _tiny_run(arrivals: list[RequestSpec], until: float = 200.0) -> list:
    sim = Simulator(server_config_from_dict(TINY), UNUSED, arrivals=arrivals)
    return sim.advance(until)


def _finished(events: list) -> dict[int, RequestFinished]:
    return {int(e.rid, 16): e for e in events if isinstance(e, RequestFinished)}


def test_tiny_config_is_what_the_scenarios_assume():
    split = server_config_from_dict(TINY).split()
    assert (split.max_running_requests, split.kv_capacity_tokens) == (4, 6000)


def test_retraction_takes_the_longest_input_among_the_fewest_outputs():
    # Requests 1 and 2 are admitted in one batch, so they have decoded equally far when the pool
    # runs out: SGLang retracts the longer input (400 tokens) and keeps the 300-token one.
    events = _tiny_run(
        [
            RequestSpec(0.0, 500, 4000, 4000),
            RequestSpec(8.0, 300, 1500, 1500),
            RequestSpec(8.0, 400, 1500, 1500),
        ]
    )
    retractions = [e for e in events if isinstance(e, Retraction)]
    assert len(retractions) == 1 and retractions[0].retracted_requests == 1
    assert retractions[0].input_tokens == 400
    done = _finished(events)
    assert [done[i].num_retractions for i in range(3)] == [0, 0, 1]
    assert all(done[i].completion_tokens == target for i, target in enumerate((4000, 1500, 1500)))
    # the retracted request is prefilled again from its input plus what it had generated
    reprefill = [e for e in events if isinstance(e, PrefillBatch) and e.time > retractions[0].time]
    assert reprefill[0].new_tokens == 400 + retractions[0].output_tokens


def test_each_request_reports_one_first_wait_as_its_first_forward_begins():
    """SGLang observes sglang:queue_time_seconds once a request, on the wait before its first forward
    (observability/req_time_stats.py set_forward_entry_time): the prefill that stages a request's first forward
    carries its wait so far, a retracted request's second prefill carries none, though the request's own queue
    time goes on counting its second wait; a goodput run counts the first waits over the bound."""
    arrivals = [RequestSpec(0.0, 500, 4000, 4000), RequestSpec(8.0, 300, 1500, 1500),
                RequestSpec(8.0, 400, 1500, 1500), RequestSpec(9.0, 1200, 10, 4096)]
    events = _tiny_run(arrivals)
    prefills = [e for e in events if isinstance(e, PrefillBatch)]
    retraction = next(e for e in events if isinstance(e, Retraction))
    first_waits = [wait for p in prefills for wait in p.first_waits]
    assert len(first_waits) == len(arrivals)  # one each, the retracted request's second prefill adds none
    assert sum(p.new_seqs for p in prefills) == len(arrivals) + 1  # though it was prefilled twice
    assert any(p.time > retraction.time and p.new_tokens >= 400 + retraction.output_tokens for p in prefills)
    done = _finished(events)
    retracted = next(r for r in done.values() if r.num_retractions == 1)
    assert retracted.queue_time > 0.0 and all(wait < retracted.queue_time for wait in first_waits[:3])
    assert sorted(first_waits) == pytest.approx(sorted(
        [r.queue_time for r in done.values() if r.num_retractions == 0] + [first_waits[2]]))
    result = simulate(server_config_from_dict(TINY), UNUSED, duration=200.0, arrivals=arrivals, queue_time_bound=1.0)
    assert result.admitted_requests == len(arrivals)
    assert result.admitted_over_bound_requests == sum(1 for wait in first_waits if wait > 1.0)


def test_a_prefill_line_counts_the_waiting_requests_tokens_as_pending():
    """SGLang's `Prefill batch` line ends its queue with `#pending-token` (load_inquirer.py
    `_get_num_pending_tokens`: every waiting request's seqlen, a retracted one's output with its prompt, and what a
    chunked prompt has left). Six prompts at once on the four-slot server: the first batch admits four and leaves
    two waiting; the running sum stays the queue's own through a retraction, with the retracted request's output."""
    arrivals = [RequestSpec(0.0, 100 * (k + 1), 100, 100) for k in range(6)]
    first = next(e for e in _tiny_run(arrivals) if isinstance(e, PrefillBatch))
    assert (first.new_seqs, first.queued_requests, first.pending_tokens) == (4, 2, 500 + 600)
    # a 2,500-token prompt cut at a 1,000-token chunk: its first batch leaves 1,500 pending, its second 500
    chunked = Simulator(server_config_from_dict({**TINY, "chunked_prefill_size": 1000}), UNUSED,
                        arrivals=[RequestSpec(0.0, 2500, 10, 10)])
    cut = [e for e in chunked.advance(100.0) if isinstance(e, PrefillBatch)]
    assert [(e.new_tokens, e.queued_requests, e.pending_tokens) for e in cut] == [(1000, 0, 1500), (1000, 0, 500),
                                                                                 (500, 0, 0)]
    sim = Simulator(server_config_from_dict(TINY), UNUSED,
                    arrivals=[RequestSpec(0.0, 500, 4000, 4000), RequestSpec(8.0, 300, 1500, 1500),
                              RequestSpec(8.0, 400, 1500, 1500), RequestSpec(9.0, 1200, 10, 4096),
                              *(RequestSpec(9.0 + k, 200 + 10 * k, 50, 4096) for k in range(8))])
    retracted_waiting = False
    for t in range(1, 400):
        sim.advance(float(t))
        assert sim.queued_tokens == sum(r.input_tokens + r.generated for r in sim.queue)
        retracted_waiting |= any(r.generated > 0 for r in sim.queue)
    assert retracted_waiting and sim.queued_tokens == 0 and not sim.queue


def test_retraction_takes_the_fewest_outputs_first_even_with_a_short_input():
    # Request 2 arrives a second after request 1: fewer outputs, so it goes first despite
    # having the shortest input.
    events = _tiny_run(
        [
            RequestSpec(0.0, 500, 4000, 4000),
            RequestSpec(8.0, 200, 1600, 1600),
            RequestSpec(9.0, 100, 2000, 2000),
        ]
    )
    retractions = [e for e in events if isinstance(e, Retraction)]
    assert len(retractions) == 1 and retractions[0].input_tokens == 100
    assert _finished(events)[2].num_retractions == 1
    # new_tokens_gained is the KV it held: input + output - 1 (the last token is not yet written)
    assert retractions[0].new_tokens_gained == 100 + retractions[0].output_tokens - 1
    assert retractions[0].mamba_slots_gained == 5


def test_new_token_ratio_decays_to_its_floor_and_jumps_after_retraction():
    events = _tiny_run(
        [
            RequestSpec(0.0, 500, 4000, 4000),
            RequestSpec(8.0, 300, 1500, 1500),
            RequestSpec(8.0, 400, 1500, 1500),
        ]
    )
    retraction = next(e for e in events if isinstance(e, Retraction))
    floor = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
    assert retraction.new_token_ratio_before == pytest.approx(floor)  # > 600 decode steps in
    # after: (sum of output kept + 20 per kept request) / (sum of max_new kept + 1)
    kept_outputs = retraction.new_token_ratio_after * (4000 + 1500 + 1) - RETRACT_DECODE_STEPS * 2
    assert kept_outputs == pytest.approx(round(kept_outputs), abs=1e-6)
    assert 2 * retraction.output_tokens < round(kept_outputs) < 4000 + 1500
    assert retraction.new_token_ratio_before < retraction.new_token_ratio_after <= 1.0


def test_admission_reserves_the_clipped_max_new_of_a_new_request():
    # 6000 tokens: a 1500-token prompt with max_new 4500 needs 1500 + 4096 (clip) + 1 < 6000 and
    # fits; a second one arriving with it does not fit the same pass and waits for the first.
    arrivals = [RequestSpec(0.0, 1500, 50, 4500), RequestSpec(0.0, 1500, 50, 4500)]
    events = _tiny_run(arrivals)
    prefills = [e for e in events if isinstance(e, PrefillBatch)]
    assert [p.new_seqs for p in prefills] == [1, 1]
    done = _finished(events)
    assert done[1].queue_time == pytest.approx(done[0].e2e_latency)
    assert 1500 + CLIP_MAX_NEW_TOKENS + 1 < 6000 < 2 * (1500 + CLIP_MAX_NEW_TOKENS)


def test_long_prompts_are_prefilled_in_chunks_that_block_decode():
    config = dataclasses.replace(load_server_config("default"), chunked_prefill_size=4096)
    arrivals = [RequestSpec(0.0, 1000, 300, 1000), RequestSpec(1.0, 10000, 10, 100)]
    sim = Simulator(config, UNUSED, arrivals=arrivals)
    events = sim.advance(60)
    chunks = [e for e in events if isinstance(e, PrefillBatch) and e.time >= 1.0]
    assert [c.new_tokens for c in chunks] == [4096, 4096, 10000 - 2 * 4096]
    ticks_during = [
        t for t in events if isinstance(t, DecodeTick) and chunks[0].time < t.time < chunks[-1].time
    ]
    assert not ticks_during
    assert {e.completion_tokens for e in events if isinstance(e, RequestFinished)} == {300, 10}


def test_inputs_beyond_the_context_are_aborted():
    config = dataclasses.replace(load_server_config("default"), model_context_len=8192)
    events = Simulator(
        config, UNUSED, arrivals=[RequestSpec(0.5, 9000, 10, 100), RequestSpec(1.0, 100, 10, 100)]
    ).advance(30)
    done = _finished(events)
    assert done[0].aborted and done[0].completion_tokens == 0
    assert not done[1].aborted and done[1].completion_tokens == 10


def test_submit_injects_a_request_into_a_running_simulation():
    sim = Simulator(load_server_config("default"), UNUSED, arrivals=[])
    sim.advance(5.0)
    rid = sim.submit(RequestSpec(0.0, 800, 25, 512))
    events = sim.advance(20.0)
    done = [e for e in events if isinstance(e, RequestFinished)]
    assert [(e.rid, e.completion_tokens, e.prompt_tokens) for e in done] == [(rid, 25, 800)]
    assert done[0].e2e_latency < 15.0  # it arrived at submit time (5 s), not at 0
    snap = sim.snapshot()
    assert snap.requests_total == 1 and snap.running_requests == 0 and snap.kv_used_tokens == 0
    assert snap.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO)  # reset when idle


# ------------------------------------------------------------------ the two pools against r


def test_state_bound_with_ample_kv_never_retracts():
    result = simulate(
        load_server_config("default"), load_workload("heavy-tail-outputs"), duration=900, seed=1, warmup=120
    )
    assert result.retractions == 0 and result.wasted_tokens == 0
    assert result.kv_bound_fraction == 0.0
    assert result.state_bound_fraction > 0.5
    assert result.mean_running_requests == pytest.approx(result.max_running_requests, rel=0.05)


def test_kv_bound_config_retracts_and_reports_kv_binding():
    result = simulate(
        load_server_config("default").with_ratio(30),
        load_workload("heavy-tail-outputs"),
        duration=1200,
        seed=1,
        warmup=120,
    )
    assert result.retractions > 0 and result.retracted_requests >= result.retractions
    assert result.wasted_tokens > 0
    assert result.kv_bound_fraction > 0.8 and result.state_bound_fraction == 0.0
    assert result.mean_running_requests < 0.5 * result.max_running_requests


def test_goodput_rises_with_r_while_state_bound_and_falls_once_kv_bound():
    config = load_server_config("default")
    workload = workload_from_dict(_chat(6.0))
    results = sweep(config, workload, [0.5, 2.0, 8.0, 24.0], duration=900, seed=4, warmup=150)
    goodput = [r.goodput_tokens_per_second for r in results]
    assert goodput[0] < goodput[1] < goodput[2] > goodput[3]
    assert results[0].state_bound_fraction > 0.9 and results[3].kv_bound_fraction > 0.9
    assert best_result(results).ratio == 8.0
    # the formula's r* for this workload sits between the state-bound and KV-bound ends
    assert results[0].ratio < results[2].formula_ratio < results[3].ratio


def test_sweep_runs_every_ratio_on_the_same_arrivals():
    config = load_server_config("default")
    workload = workload_from_dict(_chat(0.5))  # light load: every ratio serves everything
    results = sweep(config, workload, [1.0, 4.0], duration=300, seed=9)
    assert results[0].arrived_requests == results[1].arrived_requests
    assert results[0].mean_request_context == pytest.approx(results[1].mean_request_context)
    assert results[0].completed_requests == results[1].completed_requests


def test_result_fields_are_consistent():
    result = simulate(load_server_config("default"), load_workload("demo"), duration=600, seed=0, warmup=100)
    data = result.to_dict()
    assert RESULT_KEYS <= data.keys()
    assert result.queue_time_p50 <= result.queue_time_p90 <= result.queue_time_p99
    assert 0 <= result.state_bound_fraction + result.kv_bound_fraction <= 1.0 + 1e-9
    assert result.goodput_requests_per_second == pytest.approx(result.completed_requests / 500)
    assert result.formula_ratio == pytest.approx(5 * result.token_equiv / result.mean_request_context)
    assert not math.isnan(result.mean_live_context) and result.mean_live_context > 0
    with pytest.raises(ValueError):
        simulate(load_server_config("default"), load_workload("demo"), duration=100, warmup=100)


def test_slo_goodput_drops_the_requests_a_state_bound_queue_made_wait():
    """Near capacity, a clamp too low builds a queue: raw goodput still counts every completed request (it loses
    ~12%), the SLO goodput only those queued within the bound (it loses them all); a balanced split keeps both."""
    config = load_server_config("default")
    workload = workload_from_dict(_chat(3.5))
    arrivals = workload.requests(4, 900)

    def run(ratio: float, bound: float):
        return simulate(config.with_ratio(ratio), workload, duration=900, seed=4, warmup=150, arrivals=arrivals,
                        queue_time_bound=bound)

    loose, tight, balanced = run(0.5, 1e9), run(0.5, 5.0), run(8.0, 5.0)
    assert loose.slo_goodput_tokens_per_second == pytest.approx(loose.goodput_tokens_per_second)
    assert tight.queue_time_p50 > 5.0  # the queue is real
    assert tight.slo_goodput_tokens_per_second < 0.5 * tight.goodput_tokens_per_second
    assert tight.goodput_tokens_per_second > 0.8 * balanced.goodput_tokens_per_second  # raw barely sees it
    assert balanced.slo_goodput_tokens_per_second == pytest.approx(balanced.goodput_tokens_per_second, rel=0.02)


def test_in_flight_output_counts_what_a_long_request_decoded_before_the_end():
    """A long answer that ends just after the run's end: the completed figure jumps by its whole output between
    two close ends, the completed plus in-flight one does not."""
    server = load_server_config("default").with_ratio(2.0)
    arrivals = [RequestSpec(0.0, 1000, 3000, 4096), RequestSpec(0.0, 800, 40, 4096)]
    whole = simulate(server, UNUSED, duration=600.0, arrivals=arrivals)
    assert whole.completed_requests == 2 and whole.in_flight_tokens_per_second == 0.0
    finish = next(e.time for e in _finished(Simulator(server, UNUSED, arrivals=arrivals).advance(600.0)).values()
                  if e.completion_tokens == 3000)
    late = [simulate(server, UNUSED, duration=finish * k, arrivals=arrivals) for k in (0.97, 1.03)]
    before, after = late
    assert before.completed_requests == 1 and after.completed_requests == 2
    served = [(r.goodput_tokens_per_second + r.in_flight_tokens_per_second) * r.duration for r in late]
    assert served[0] == pytest.approx(served[1], rel=0.07)  # tokens decoded by either end, 3% of the time apart
    assert before.goodput_tokens_per_second * before.duration == pytest.approx(40)  # the completed figure saw only the short one
    assert before.in_flight_slo_tokens_per_second == before.in_flight_tokens_per_second  # it never queued
    # what the requests decoded by the end, from the running batch's sequence lengths
    sim = Simulator(server, UNUSED, arrivals=arrivals)
    sim.advance(finish * 0.5)
    decoded = sim.snapshot().decode_sum_seq_lens - 1000 + 1
    assert sim.in_flight_output(10.0) == (decoded, decoded)
