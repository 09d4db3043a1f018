"""Sample TargetStatus values for the export tests: a fully populated one far from its recommendation,
and sparse ones (no recommendation, missing fields)."""

from __future__ import annotations

import math

from advisor.estimate.summary import WorkloadSummary
from advisor.recommend.types import Recommendation
from advisor.status import TargetStatus

LIVE_RATIO = 0.9
RECOMMENDED_RATIO = 1.6


def drifted_status(
    server: str = "10.0.0.7:30000",
    model_name: str = "Qwen/Qwen3-Next-80B-A3B-Instruct",
    decision: str = "raise_ratio",
    confidence: float = 0.85,
) -> TargetStatus:
    """A server running ratio 0.9 whose workload wants 1.6: state pool binds, confident advice."""
    return TargetStatus(
        server=server,
        model_name=model_name,
        up=True,
        stale=False,
        last_success_timestamp=1_790_000_000.0,
        last_cycle_duration_seconds=0.125,
        info={"version": "0.5.23", "strategy": "none", "ssm_dtype": "bfloat16", "kv_dtype": "fp8_e4m3",
              "tp": "8", "dp": "1", "pp": "1", "dcp": "1"},
        workload=WorkloadSummary(
            context_length_mean=7601.7,
            context_length_p50=5200.0,
            context_length_p90=15800.0,
            context_length_p99=31000.0,
            live_context_mean=8300.0,
            effective_context_length=9100.0,
            spikiness=0.35,
            retractions_per_second=0.02,
            retracted_tokens_per_second=150.0,
            state_pool_saturation_ratio=0.62,
            kv_blocked_ratio=0.01,
            requests_observed=4000.0,
            history_seconds=3600.0,
        ),
        recommendation=Recommendation(
            decision=decision,
            reason="state pool binds 62% of the time while the KV pool sits 40% empty",
            ratio=RECOMMENDED_RATIO,
            ratio_lower=1.35,
            ratio_upper=1.9,
            live_ratio=LIVE_RATIO,
            ratio_drift=math.log(LIVE_RATIO / RECOMMENDED_RATIO),
            binding_pool_live="state",
            binding_pool_recommended="balanced",
            predicted_max_running_requests_live=51,
            predicted_max_running_requests_recommended=83,
            observed_max_running_requests=51,
            kv_capacity_requests_live=128.3,
            kv_capacity_requests_recommended=92.4,
            predicted_gain_ratio=83 / 51,
            predicted_goodput_gain_ratio=1.07,
            goodput_curve_width_ratio=1.3,
            replay_regime_seconds=540.0,
            replay_trend_load=1.3,
            replay_queue_shown=0.3,
            replay_queue_replayed=0.01,
            replay_queue_load=1.12,
            replay_work_scale=0.96,
            token_equiv=4080.0,
            slots_per_request=5,
            recommended_max_mamba_cache_size=None,
            recommended_mem_fraction_static=None,
            confidence=confidence,
            bias=0.04,
            flag_line="--mamba-full-memory-ratio 1.6",
            notes=["context lengths from 4000 finished requests"],
        ),
        scrape_errors_total={"metrics": 3, "server_info": 0, "logs": 1},
        last_errors=["metrics: connection refused"],
    )


def unreachable_status(server: str = "10.0.0.8:30000") -> TargetStatus:
    """A server the advisor never reached: no model name known, no recommendation."""
    return TargetStatus(server=server, up=False, scrape_errors_total={"metrics": 12})
