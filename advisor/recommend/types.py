"""What one advisor cycle concludes about one SGLang server: the contract between the recommender,
the daemon and the exporter. Plain dataclasses, JSON-friendly via `to_dict()`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DECISIONS = (
    "insufficient_data",
    "hold",
    "raise_ratio",
    "lower_ratio",
    "pin_state_pool",
    "unified_memory",
    "inputs_stale",
)
POOLS = ("state", "kv", "balanced")
CONFIGS = ("live", "recommended")


@dataclass
class WorkloadSummary:
    """The recency-weighted workload picture the recommendation was made from."""

    context_length_mean: float | None = None
    context_length_p50: float | None = None
    context_length_p90: float | None = None
    context_length_p99: float | None = None
    live_context_mean: float | None = None  # decode_sum_seq_lens / running, time-weighted
    effective_context_length: float | None = None  # the L the KV pool sees (length-biased + reservation)
    spikiness: float | None = None  # 0 = steady; see estimate module for the definition
    retractions_per_second: float | None = None
    retracted_tokens_per_second: float | None = None
    state_pool_saturation_ratio: float | None = None  # time fraction running == clamp with a queue
    kv_blocked_ratio: float | None = None  # time fraction a queue waits with running < clamp
    requests_observed: float = 0.0
    history_seconds: float = 0.0


@dataclass
class Recommendation:
    decision: str
    reason: str
    ratio: float | None = None
    ratio_lower: float | None = None
    ratio_upper: float | None = None
    live_ratio: float | None = None
    ratio_drift: float | None = None  # ln(live / recommended)
    binding_pool_live: str | None = None
    binding_pool_recommended: str | None = None
    predicted_max_running_requests_live: int | None = None
    predicted_max_running_requests_recommended: int | None = None
    observed_max_running_requests: int | None = None
    kv_capacity_requests_live: float | None = None
    kv_capacity_requests_recommended: float | None = None
    predicted_gain_ratio: float | None = None  # concurrency at recommended / at live, minus nothing (1.0 = no gain)
    token_equiv: float | None = None
    slots_per_request: int | None = None
    recommended_max_mamba_cache_size: int | None = None
    recommended_mem_fraction_static: float | None = None
    confidence: float = 0.0
    bias: float = 0.0  # the spikiness bias applied to r, as a factor minus 1
    flag_line: str | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"unknown decision {self.decision!r}")


@dataclass
class TargetStatus:
    """Everything the exporter shows about one target (one SGLang server)."""

    server: str
    model_name: str = ""
    up: bool = False
    stale: bool = False
    last_success_timestamp: float | None = None
    last_cycle_duration_seconds: float | None = None
    info: dict[str, str] = field(default_factory=dict)  # version, strategy, ssm_dtype, kv_dtype, tp, dp, pp, dcp
    workload: WorkloadSummary = field(default_factory=WorkloadSummary)
    recommendation: Recommendation | None = None
    scrape_errors_total: dict[str, int] = field(default_factory=dict)  # source -> count
    last_errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
