"""The contract between the scheduler model (engine) and whatever feeds or watches it: the requests it serves,
the traffic source that issues them, and the events and snapshots it reports (emulated server, CLI, bench, replay).

Plain dataclasses only. One `Simulator` models one DP worker (one scheduler) of an SGLang
server; an emulated DP>1 server runs one per DP rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the workload issues it."""

    time: float  # arrival, simulated seconds since start
    input_tokens: int
    output_tokens: int  # what the request really generates (already <= max_new_tokens)
    max_new_tokens: int  # the client's cap, the scheduler reserves against it
    prefix_group: str | None = None  # requests of a group share a cached prefix (radix reuse)
    prefix_tokens: int = 0  # length of that shared prefix (< input_tokens)
    # A conversation turn: once it finishes, its whole sequence (input + output) is what the group's
    # cached prefix holds, as SGLang's radix cache inserts a finished request (cache_finished_req); the
    # next turn of the session then matches it. False for a fixed shared prefix (a system prompt).
    extends_prefix: bool = False



class TrafficSource(Protocol):
    """What the scheduler model needs of a traffic description (a sim workload, a fitted replay picture)."""

    @property
    def name(self) -> str: ...

    def arrivals(self, rng: np.random.Generator, start: float, end: float) -> Iterator[RequestSpec]: ...

    def requests(self, seed: int, duration: float) -> list[RequestSpec]: ...


@dataclass
class RequestFinished:
    """A request left the server (finished or aborted) at simulated time `time`."""

    time: float
    rid: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    num_retractions: int
    queue_time: float
    e2e_latency: float
    max_new_tokens: int
    aborted: bool = False


@dataclass
class Retraction:
    """One retraction event (decode could not allocate): SGLang's `KV cache pool is full` line."""

    time: float
    retracted_requests: int
    input_tokens: int  # sum of len(origin_input_ids) of the retracted requests
    output_tokens: int  # sum of len(output_ids) of the retracted requests
    new_tokens_gained: int
    mamba_slots_gained: int
    new_token_ratio_before: float
    new_token_ratio_after: float


@dataclass
class PrefillBatch:
    """One prefill batch (SGLang logs one `Prefill batch` line per batch)."""

    time: float
    new_seqs: int
    new_tokens: int
    cached_tokens: int
    running_requests: int
    queued_requests: int
    full_token_usage: float
    mamba_usage: float
    input_throughput: float
    # `#pending-token`: the waiting requests' whole sequences and the rest of a prompt being chunked
    pending_tokens: int = 0
    # The first waits of the requests whose first forward this is (a retracted request's later prefill adds none):
    # SGLang observes each into `sglang:queue_time_seconds` as that forward begins.
    first_waits: tuple[float, ...] = ()


@dataclass
class DecodeTick:
    """Every `decode_log_interval` decode steps SGLang logs a `Decode batch` line and refreshes gauges."""

    time: float
    running_requests: int
    queued_requests: int
    kv_used_tokens: int
    full_token_usage: float
    mamba_used_slots: int
    mamba_usage: float
    gen_throughput: float


SimEvent = RequestFinished | Retraction | PrefillBatch | DecodeTick


@dataclass
class SimSnapshot:
    """Live state and cumulative counters of one DP worker at simulated time `time`.

    Per-request distributions (token histograms, latencies) are built by the watcher from
    `RequestFinished` events, so a snapshot stays small however long the run.
    """

    time: float
    # pools (constants for a run)
    kv_capacity_tokens: int
    max_mamba_cache_size: int
    max_running_requests: int
    page_size: int
    # gauges
    running_requests: int
    queued_requests: int
    kv_used_tokens: int  # locked by running requests
    kv_evictable_tokens: int  # held by the radix cache, evictable
    mamba_used_slots: int
    mamba_evictable_slots: int
    decode_sum_seq_lens: int
    new_token_ratio: float
    gen_throughput: float
    cache_hit_rate: float
    # cumulative counters since (simulated) server start
    requests_total: int
    aborted_requests_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    cached_tokens_total: int
    retracted_requests_total: int
    retracted_input_tokens_total: int
    retracted_output_tokens_total: int
    decode_tokens_total: int
    prefill_compute_tokens_total: int
