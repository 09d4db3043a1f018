"""The estimator's output: the recency-weighted workload picture one recommendation is made from.
Plain data, JSON-friendly; the recommender reads it and the exporter shows it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkloadSummary:
    """The recency-weighted workload picture the recommendation was made from."""

    context_length_mean: float | None = None
    context_length_p50: float | None = None
    context_length_p90: float | None = None
    context_length_p99: float | None = None
    live_context_mean: float | None = None  # decode_sum_seq_lens / running, time-weighted
    effective_context_length: float | None = None  # the L the KV pool sees: residence-weighted final context
    spikiness: float | None = None  # 0 = steady; see estimate module for the definition
    retractions_per_second: float | None = None
    retracted_tokens_per_second: float | None = None
    state_pool_saturation_ratio: float | None = None  # time fraction running == clamp with a queue
    kv_blocked_ratio: float | None = None  # time fraction a queue waits with running < clamp
    requests_observed: float = 0.0
    history_seconds: float = 0.0
