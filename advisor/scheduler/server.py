"""One DP worker's view of a hybrid SGLang server as the scheduler model needs it: the serving config, the two
per-GPU byte constants, `rest`, the scheduler knobs and the step-time cost model. Pure; loading it from YAML is
`advisor.sim.config`'s job. `split()` sizes the pools with `advisor.model.pools.split_pools`, exactly as SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from advisor.model.pools import ByteConstants, PoolSplit, split_pools
from advisor.model.serving import ServingConfig
from advisor.scheduler.costmodel import CostModel


@dataclass(frozen=True)
class SchedulerServerConfig:
    """One DP worker's view of a hybrid SGLang server, as the simulator needs it."""

    serving: ServingConfig
    constants: ByteConstants
    rest_bytes: float  # per-GPU bytes for both pools (state + KV)
    model_name: str = "example/hybrid"
    version: str = "0.5.23"
    model_context_len: int = 262144
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    decode_log_interval: int = 40
    schedule_conservativeness: float = 1.0
    enable_radix_prefix_reuse: bool = False
    # Extensions beyond the shared interface (all defaulted):
    name: str = "custom"
    cost: CostModel = field(default_factory=CostModel)
    # SGLang 0.5.23 appends retracted requests to the back of the waiting queue
    # (scheduler.py `_add_request_to_queue`, fcfs does not re-sort); True puts them in front.
    retract_to_front: bool = False
    replayssm_fixed_bytes: float = 0.0

    def split(self) -> PoolSplit:
        return split_pools(
            self.rest_bytes,
            self.serving,
            self.constants,
            replayssm_fixed_bytes=self.replayssm_fixed_bytes,
            model_context_len=self.model_context_len,
        )

    def with_ratio(self, r: float) -> SchedulerServerConfig:
        return replace(self, serving=self.serving.with_ratio(r))

    @property
    def ratio(self) -> float | None:
        """The configured --mamba-full-memory-ratio; None when the state pool is pinned."""
        if self.serving.max_mamba_cache_size is not None:
            return None
        return self.serving.mamba_full_memory_ratio

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_name": self.model_name,
            "version": self.version,
            "model_context_len": self.model_context_len,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "decode_log_interval": self.decode_log_interval,
            "schedule_conservativeness": self.schedule_conservativeness,
            "enable_radix_prefix_reuse": self.enable_radix_prefix_reuse,
            "retract_to_front": self.retract_to_front,
            "rest_bytes": self.rest_bytes,
            "replayssm_fixed_bytes": self.replayssm_fixed_bytes,
            "serving": self.serving.to_dict(),
            "constants": {
                "state_bytes_per_slot": self.constants.state_bytes_per_slot,
                "kv_bytes_per_token": self.constants.kv_bytes_per_token,
                "draft_kv_bytes_per_token": self.constants.draft_kv_bytes_per_token,
            },
            "cost": self.cost.to_dict(),
        }
