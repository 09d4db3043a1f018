"""The scheduler model against SGLang 0.5.23's own rules, one test per rule with the source line it
follows (paths under `sglang/srt/`): how a request's max_new_tokens is set or refused on arrival, what a
client without max_tokens reserves, and what a finished conversation turn leaves in the radix cache."""

from __future__ import annotations

import dataclasses

import pytest

from advisor.scheduler.engine import (
    CLIP_MAX_NEW_TOKENS,
    RETRACT_DECODE_STEPS,
    UNSET_MAX_NEW_TOKENS,
    Simulator,
)
from advisor.scheduler.types import PrefillBatch, RequestFinished, Retraction
from advisor.sim.config import server_config_from_dict
from advisor.sim.workload import RequestSpec, workload_from_dict

# 1000-byte state slots, 1-byte KV tokens, S = 5: r = 3.5 of 27000 bytes -> clamp 4, 6000 KV tokens.
TINY = {
    "name": "tiny",
    "serving": {"mamba_full_memory_ratio": 3.5},
    "constants": {"state_bytes_per_slot": 1000, "kv_bytes_per_token": 1},
    "rest_bytes": 27000,
}
UNUSED = workload_from_dict({"arrival": {"process": "poisson", "rate": 1}, "classes": [{"input": 100, "output": 10}]})


def _run(arrivals: list[RequestSpec], *, until: float = 300.0, **config: object) -> list:
    server = dataclasses.replace(server_config_from_dict(TINY), **config)
    return Simulator(server, UNUSED, arrivals=arrivals).advance(until)


def _finished(events: list) -> list[RequestFinished]:
    return sorted((e for e in events if isinstance(e, RequestFinished)), key=lambda e: int(e.rid, 16))


def test_a_client_without_max_tokens_gets_the_rest_of_the_context():
    # scheduler.py 2695-2716 (init_req_max_new_tokens): None reads as 1 << 30, clipped to
    # max_req_len - input - 1, max_req_len = min(context_length - 1, KV capacity - 1) (tp_worker.py 568-571).
    done = _finished(_run([RequestSpec(0.0, 100, 20, UNSET_MAX_NEW_TOKENS)], model_context_len=4096))
    assert done[0].max_new_tokens == 4096 - 1 - 100 - 1 and not done[0].aborted
    # ... and to the empty KV pool when that is the smaller (mem_cache/allocator/base.py 102-105):
    # min(6000 - 1 - 100 - 1, 6000 - 100 - page 1 - 1) on the 6000-token pool.
    done = _finished(_run([RequestSpec(0.0, 100, 20, UNSET_MAX_NEW_TOKENS)]))
    assert done[0].max_new_tokens == 6000 - 100 - 2


def test_a_client_max_tokens_over_the_context_is_refused_not_truncated():
    # tokenizer_manager.py 1353-1378: input + max_new_tokens > context_length raises (allow_auto_truncate
    # is off by default, arg_groups/fields/serving.py 254-257); exactly the context passes, and the
    # scheduler then clips it to max_req_len - input - 1.
    events = _run(
        [RequestSpec(0.0, 100, 20, 3997), RequestSpec(1.0, 100, 20, 3996)], model_context_len=4096
    )
    refused, served = _finished(events)
    assert refused.aborted and refused.completion_tokens == 0 and refused.e2e_latency == 0
    assert not served.aborted and served.max_new_tokens == 4096 - 1 - 100 - 1


def test_inputs_the_scheduler_cannot_take_are_refused_on_arrival():
    # scheduler.py 3231: len(origin_input_ids) >= max_req_input_len = max_req_len - 5 (tp_worker.py 572);
    # on the 6000-token pool max_req_len = 5999, so 5994 is refused and 5993 served.
    done = _finished(_run([RequestSpec(0.0, 5994, 3, 10), RequestSpec(1.0, 5993, 3, 10)]))
    assert done[0].aborted and done[0].e2e_latency == 0
    assert not done[1].aborted and done[1].completion_tokens == 3


def test_an_unset_max_tokens_reserves_the_clip_at_admission():
    # schedule_policy.py 1407-1411: the admission check charges min(max_new - output, CLIP) for the new
    # request, so an unset max_tokens costs the full 4096 clip: 1500 + 4096 + page fits the 6000-token pool
    # once; the second waits for the first although both would fit by their real outputs.
    arrivals = [RequestSpec(0.0, 1500, 30, UNSET_MAX_NEW_TOKENS), RequestSpec(0.0, 1500, 30, UNSET_MAX_NEW_TOKENS)]
    events = _run(arrivals)
    assert [p.new_seqs for p in events if isinstance(p, PrefillBatch)] == [1, 1]
    assert 1500 + CLIP_MAX_NEW_TOKENS + 1 < 6000 < 2 * (1500 + CLIP_MAX_NEW_TOKENS + 1)
    # clients that ask for 200 tokens at most are admitted together
    events = _run([RequestSpec(0.0, 1500, 30, 200), RequestSpec(0.0, 1500, 30, 200)])
    assert [p.new_seqs for p in events if isinstance(p, PrefillBatch)] == [2]


def test_retraction_sets_the_ratio_from_the_clipped_max_new_of_the_requests_kept():
    # new_token_ratio_tracker.py estimate_new_token_ratio_after_retract: (decoded + 20 x kept) /
    # (sum of sampling_params.max_new_tokens + 1), where max_new_tokens is the scheduler's clipped value
    # (scheduler.py 2736), so a kept request without max_tokens drives the ratio far below its floor.
    events = _run(
        [
            RequestSpec(0.0, 500, 4000, UNSET_MAX_NEW_TOKENS),
            RequestSpec(8.0, 300, 1500, 1500),
            RequestSpec(8.0, 400, 1500, 1500),
        ]
    )
    retraction = next(e for e in events if isinstance(e, Retraction))
    kept_max_new = (6000 - 500 - 2) + 1500  # the unset request (clipped to the pool) and the 300-token one
    kept_output = retraction.new_token_ratio_after * (kept_max_new + 1) - RETRACT_DECODE_STEPS * 2
    assert kept_output == pytest.approx(round(kept_output), abs=1e-6)
    assert 0 < round(kept_output) < 4000 + 1500


def test_a_finished_turn_leaves_its_sequence_for_the_next_turn():
    # A finished request's tokens are inserted into the radix cache (cache_finished_req); a retracted one
    # is released without inserting (schedule_batch.py 2388-2392). The next turn matches input + output - 1
    # tokens (the last sampled token has no KV yet) and prefills only its new message.
    first = RequestSpec(0.0, 2000, 100, 500, "s-0", 0, extends_prefix=True)
    second = RequestSpec(60.0, 2400, 50, 500, "s-0", 2100, extends_prefix=True)
    events = _run([first, second], enable_radix_prefix_reuse=True)
    done = _finished(events)
    assert done[0].cached_tokens == 0 and done[1].cached_tokens == 2000 + 100 - 1
    prefills = [p for p in events if isinstance(p, PrefillBatch)]
    assert [p.new_tokens for p in prefills] == [2000, 2400 - 2099]
    # without radix reuse, or for a fixed shared prefix that is not a conversation, nothing grows
    events = _run([first, second])
    assert [e.cached_tokens for e in _finished(events)] == [0, 0]
    fixed = [dataclasses.replace(first, extends_prefix=False), dataclasses.replace(second, extends_prefix=False)]
    assert [e.cached_tokens for e in _finished(_run(fixed, enable_radix_prefix_reuse=True))] == [0, 0]


def test_a_cached_prefix_needs_a_free_state_slot_to_survive():
    # Allocating a request's state slots evicts cached prefix states first (mem_cache/allocation.py 339-341,
    # unified_radix_cache.py 727-776): on the tiny server (20 slots, S = 5) four running requests leave no
    # slot for the first turn's state, so the second turn prefills from scratch; with one running it hits.
    first = RequestSpec(0.0, 1000, 20, 200, "s-0", 0, extends_prefix=True)
    second = RequestSpec(40.0, 1100, 20, 200, "s-0", 1020, extends_prefix=True)
    busy = [RequestSpec(39.5, 100, 300, 300) for _ in range(4)]  # 4 x (100 + 300 + 1) fits the 6000 tokens
    alone = _finished(_run([first, busy[0], second], enable_radix_prefix_reuse=True))
    assert [e.cached_tokens for e in alone if e.prompt_tokens > 100] == [0, 1019]
    crowded = _run([first, *busy, second], enable_radix_prefix_reuse=True)
    assert max(p.running_requests + p.new_seqs for p in crowded if isinstance(p, PrefillBatch)) == 4
    assert [e.cached_tokens for e in _finished(crowded) if e.prompt_tokens > 100] == [0, 0]
