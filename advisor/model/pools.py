"""The dual-pool arithmetic of a hybrid SGLang server: token_equiv, r*, the exact pool split.

Pure functions over plain numbers. The split follows SGLang 0.5.23
`mem_cache/kv_cache_configurator.py` (`_handle_max_mamba_cache`, `resolve_max_num_reqs`):
state budget `rest * r / (1 + r)`, one padding slot per pool, the joint solve for speculative
intermediate state, `max_running_requests <= max_mamba_cache_size // S`, ReplaySSM rings, and
`model_executor/pool_configurator.py` (`DefaultPoolConfigurator`) for the per-token KV cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.model.serving import (
    ServingConfig,
    effective_draft_tokens,
    replayssm_active,
    reserves_spec_state,
    slots_per_request,
    spec_enabled,
)

GIB = 1 << 30
# Two pools whose request capacities are within this relative distance are "balanced".
BALANCED_TOLERANCE = 0.05
# Below this r the state pool is a sliver and the seed says pin the slot count instead.
PIN_RATIO_THRESHOLD = 0.15
# SGLang sets max_running_requests to 48 for EAGLE-family / NGram spec when the user did not
# (arg_groups/speculative_hook.py).
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48


@dataclass(frozen=True)
class ByteConstants:
    """Per-GPU bytes of one state slot and of one physical KV token row (full-attention layers only).

    Under DCP `kv_bytes_per_token` is per physical row (KV heads `max(1, H // (tp // dcp))`); SGLang's
    logical token counts are rows x dcp.
    """

    state_bytes_per_slot: float
    kv_bytes_per_token: float
    # The draft model's KV per physical row, charged inside the same per-token cell under EAGLE/MTP
    # (pool_configurator.py `DefaultPoolConfigurator.__init__`: cell += cell * draft_layers / layers);
    # 0 without a draft model.
    draft_kv_bytes_per_token: float = 0.0
    # ReplaySSM spec-verify ring bytes for one request (`replayssm_ring_bytes_per_req`), 0 when off.
    replayssm_ring_bytes_per_request: float = 0.0

    def __post_init__(self) -> None:
        if not (self.state_bytes_per_slot > 0 and self.kv_bytes_per_token > 0):
            raise ValueError("state_bytes_per_slot and kv_bytes_per_token must both be > 0")
        if self.draft_kv_bytes_per_token < 0 or self.replayssm_ring_bytes_per_request < 0:
            raise ValueError("draft_kv_bytes_per_token and replayssm_ring_bytes_per_request must be >= 0")

    @property
    def token_equiv(self) -> float:
        return self.state_bytes_per_slot / self.kv_bytes_per_token


def kv_cell_bytes(config: ServingConfig, constants: ByteConstants) -> float:
    """Bytes one physical KV row costs the budget: the target's KV plus, with spec on, the draft's."""
    if spec_enabled(config):
        return constants.kv_bytes_per_token + constants.draft_kv_bytes_per_token
    return constants.kv_bytes_per_token


def slot_bytes(config: ServingConfig, constants: ByteConstants) -> float:
    """Bytes one state slot costs the budget: the state, plus under an active ReplaySSM on a KDA model the ring
    that rides on every slot (kv_cache_configurator.py ~3282-3291: GDN's ring is fixed request scratch instead)."""
    if config.linear_family == "kda" and replayssm_active(config):
        return constants.state_bytes_per_slot + constants.replayssm_ring_bytes_per_request
    return constants.state_bytes_per_slot


def cell_token_equiv(config: ServingConfig, constants: ByteConstants) -> float:
    """token_equiv of a whole slot (a KDA ReplaySSM ring included) against the whole per-token cell (draft KV
    included under spec)."""
    return slot_bytes(config, constants) / kv_cell_bytes(config, constants)


def optimal_ratio(
    context_length: float,
    token_equiv: float,
    slots: int,
    draft_tokens: int = 0,
    dcp_size: int = 1,
) -> float:
    """The seed's r* = (S + D) * token_equiv * dcp_size / L."""
    if context_length <= 0:
        raise ValueError(f"context length must be > 0, got {context_length}")
    return (slots + draft_tokens) * token_equiv * dcp_size / context_length


def optimal_ratio_for(config: ServingConfig, constants: ByteConstants, context_length: float) -> float:
    """r* for a serving config, token_equiv taken against the whole KV cell SGLang 0.5.23 sizes with.

    The draft's KV sits in the same physical-row cell as the target's (pool_configurator.py
    `DefaultPoolConfigurator.__init__`), so a logical token costs cell / dcp and the clean x dcp holds.
    """
    slots = slots_per_request(config)
    draft = effective_draft_tokens(config)
    return optimal_ratio(context_length, cell_token_equiv(config, constants), slots, draft, config.dcp_size)


@dataclass(frozen=True)
class PoolSplit:
    """What SGLang would allocate on one GPU (one DP shard) for a given config and rest."""

    ratio: float | None  # None when the state pool is pinned
    max_mamba_cache_size: int
    kv_capacity_tokens: int  # physical tokens on this rank
    max_running_requests: int  # the per-DP-worker clamp
    state_pool_bytes: float
    kv_pool_bytes: float
    intermediate_bytes: float
    clamped_by_state_pool: bool


def requested_cap(config: ServingConfig) -> int | None:
    """`max(1, max_running_requests // attn_dp)` as SGLang sizes with it: the user's value, else the spec hook's
    default of 48 (arg_groups/speculative_hook.py ~1086-1095), else None (resolved later from the KV pool)."""
    if config.max_running_requests is not None:
        return max(1, config.max_running_requests // config.attn_dp_size)
    if spec_enabled(config) and config.draft_tokens > 0:
        return max(1, SPEC_DEFAULT_MAX_RUNNING_REQUESTS // config.attn_dp_size)
    return None


def split_pools(
    rest_bytes: float,
    config: ServingConfig,
    constants: ByteConstants,
    *,
    replayssm_fixed_bytes: float = 0.0,
    model_context_len: int = 262144,
) -> PoolSplit:
    """Split `rest` (per-GPU bytes for both pools) exactly as SGLang 0.5.23 does
    (kv_cache_configurator.py `_handle_max_mamba_cache`, lines 3229-3409).

    Uses `config.max_mamba_cache_size` when pinned; with `--disable-radix-cache` and
    `--max-running-requests`, one slot per request (`mrr // attn_dp`) and no ratio split; else
    `config.mamba_full_memory_ratio`. `constants.state_bytes_per_slot` is the charged per-stage share
    under PP (`state_shapes.pp_charged_share`). ReplaySSM (GDN/KDA) rings: GDN's is fixed request scratch
    for `mrr // attn_dp + 1` requests, KDA's rides on every slot. `replayssm_fixed_bytes` adds a fixed
    amount on top (kept for callers that measured it).
    """
    if rest_bytes <= 0:
        raise ValueError(f"rest must be > 0 bytes, got {rest_bytes}")
    per_slot = constants.state_bytes_per_slot
    slots = slots_per_request(config)
    draft = config.draft_tokens if spec_enabled(config) else 0
    replay = replayssm_active(config)
    reserves = reserves_spec_state(config)
    requested = requested_cap(config)
    ring_fixed = float(replayssm_fixed_bytes)
    ring_per_slot = 0.0
    if replay and constants.replayssm_ring_bytes_per_request > 0:
        if config.linear_family == "kda":
            ring_per_slot = constants.replayssm_ring_bytes_per_request
        else:
            ring_fixed += constants.replayssm_ring_bytes_per_request * ((requested or 1) + 1)
    slot_bytes = per_slot + ring_per_slot
    remaining = float(rest_bytes)
    intermediate = 0.0
    ratio: float | None

    if config.max_mamba_cache_size is not None:
        ratio = None
        cache_size = config.max_mamba_cache_size // config.attn_dp_size
        if reserves:
            capped = min(requested or 1, cache_size // slots)
            intermediate = per_slot * (capped + 1) * draft
    elif config.disable_radix_cache and requested is not None:
        # radix off with a resolved max_running_requests (the user's, or spec's default 48): one slot per request
        ratio = None
        cache_size = requested
        if reserves:
            intermediate = per_slot * (cache_size + 1) * draft
    else:
        ratio = config.mamba_full_memory_ratio
        budget = rest_bytes * ratio / (1 + ratio)
        if reserves:
            cache_size = int(
                (budget - per_slot * (1 + draft) - ring_per_slot) // (per_slot * (1 + draft / slots) + ring_per_slot)
            )
            capped = min(requested or 1, max(cache_size, 0) // slots)
            intermediate = per_slot * (capped + 1) * draft
        else:
            cache_size = int((budget - ring_fixed - slot_bytes) // slot_bytes)
    cache_size = max(cache_size, 0)
    remaining -= intermediate
    state_bytes = (cache_size + 1) * slot_bytes + ring_fixed
    kv_bytes = max(remaining - state_bytes, 0.0)
    kv_tokens = int(kv_bytes // kv_cell_bytes(config, constants))
    kv_tokens -= kv_tokens % config.page_size

    # resolve_max_num_reqs: a token-derived estimate (2048..4096) or the user's value,
    # both bounded by token_capacity // 2, then by the state pool.
    estimated = max(min(int(kv_tokens / model_context_len * 512), 4096), 2048)
    cap = min(requested if requested is not None else estimated, kv_tokens // 2)
    state_cap = cache_size // slots
    clamped = state_cap < cap
    return PoolSplit(
        ratio=ratio,
        max_mamba_cache_size=cache_size,
        kv_capacity_tokens=kv_tokens,
        max_running_requests=min(cap, state_cap),
        state_pool_bytes=state_bytes,
        kv_pool_bytes=kv_bytes,
        intermediate_bytes=intermediate,
        clamped_by_state_pool=clamped,
    )


def kv_capacity_requests(kv_capacity_tokens: float, context_length: float, dcp_size: int = 1) -> float:
    """How many requests of context L the KV pool holds: tokens * dcp / L."""
    if context_length <= 0:
        raise ValueError(f"context length must be > 0, got {context_length}")
    return kv_capacity_tokens * dcp_size / context_length


def binding_pool(state_clamp: float, kv_capacity: float, tolerance: float = BALANCED_TOLERANCE) -> str:
    """Which pool caps concurrency first: 'state', 'kv' or 'balanced' (within `tolerance`)."""
    top = max(state_clamp, kv_capacity)
    if top <= 0 or abs(state_clamp - kv_capacity) / top <= tolerance:
        return "balanced"
    return "state" if state_clamp < kv_capacity else "kv"


def balanced_concurrency(
    rest_bytes: float, config: ServingConfig, constants: ByteConstants, context_length: float
) -> float:
    """Requests per DP worker at the balance point: rest / ((S+D)*state + L*cell/dcp)."""
    slots = slots_per_request(config)
    draft = effective_draft_tokens(config)
    kv_per_request = context_length * kv_cell_bytes(config, constants) / config.dcp_size
    return rest_bytes / ((slots + draft) * slot_bytes(config, constants) + kv_per_request)


def pin_size(target_concurrency: float, config: ServingConfig) -> int:
    """--max-mamba-cache-size that admits `target_concurrency` requests per DP worker."""
    slots = slots_per_request(config)
    return max(1, math.floor(target_concurrency)) * slots * config.attn_dp_size


@dataclass(frozen=True)
class UnifiedMemoryCap:
    """Under --enable-unified-memory the bytes float between state and KV at run time, but SGLang 0.5.23 still
    sizes the state pool (`_handle_max_mamba_cache` runs) and still clamps max_running_requests to
    max_mamba_cache_size // S (mem_cache/unified_memory_pool.py ~1680-1691: the state bytes ride on top of the
    token budget; ~1829-1834: the ratio "governs the total budget only"): the ratio, or --max-mamba-cache-size,
    sets the concurrency cap. Per DP worker."""

    live_cap: int  # max_running_requests at the live config
    supported_concurrency: float  # requests of the workload's context the shared budget holds
    recommended_max_mamba_cache_size: int  # the pin whose cap admits them (all DP shards)
    cap_binds: bool  # the live cap stops concurrency below what memory holds


def unified_memory_cap(
    rest_bytes: float, config: ServingConfig, constants: ByteConstants, context_length: float,
    *, model_context_len: int = 262144,
) -> UnifiedMemoryCap:
    """The concurrency cap a unified-memory server runs with and the --max-mamba-cache-size that matches the
    memory: the shared budget holds rest / ((S + D) * slot + L * cell / dcp) requests of context L
    (`balanced_concurrency`), and the cap should admit that many, no fewer."""
    live = split_pools(rest_bytes, config, constants, model_context_len=model_context_len)
    supported = balanced_concurrency(rest_bytes, config, constants, context_length)
    return UnifiedMemoryCap(
        live_cap=live.max_running_requests,
        supported_concurrency=supported,
        recommended_max_mamba_cache_size=pin_size(supported, config),
        cap_binds=live.max_running_requests < math.floor(supported) * (1 - BALANCED_TOLERANCE),
    )
