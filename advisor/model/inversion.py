"""The one inversion of SGLang's pool split: byte constants and the shared budget from the sizes a server reports.

Pure. The boot log, `/server_info` and the Prometheus store all give a pool's slot count, its KV token count and
bytes; this undoes SGLang 0.5.23's padding (one slot per state pool, one page per KV pool: `mem_cache/
memory_pool.py`), the joint solve under speculative decoding (`kv_cache_configurator.py` ~3350-3378), the PP
rules (every stage charged the largest stage's state share, ~3233-3260; the smallest KV token count kept, ~3106-3116)
and ReplaySSM rings (~3269-3291), so that `split_pools` at the live ratio gives back what the server allocated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.model.pools import SPEC_DEFAULT_MAX_RUNNING_REQUESTS, ByteConstants, requested_cap
from advisor.model.serving import (
    ServingConfig,
    replayssm_active,
    reserves_spec_state,
    slots_per_request,
    spec_enabled,
)

# Where the state bytes per slot came from.
STATE_FROM_POOL = "state_pool"  # the state pool's own bytes (a boot log's `Mamba Cache is allocated` line)
STATE_FROM_RATIO = "ratio"  # solved from the ratio, the slot count and the KV pool (the joint solve inverted)
STATE_FROM_MODEL = "model_config"  # derived from the model's config.json
STATE_UNKNOWN = "unknown"


@dataclass(frozen=True)
class StagePools:
    """What one GPU (one PP stage of one DP shard) reports of its pools. Bytes are as allocated.

    `kv_tokens` is the physical row count the KV pool was sized for (logical / dcp). `state_pool_bytes` is the
    persistent conv + SSM state (without speculative scratch); None or 0 when the report does not carry it
    (`/server_info`) or rounds it away (a tiny model's `0.00GB`). `replayssm_ring_bytes` is the ReplaySSM ring
    buffers as allocated (the `ReplaySSM ring buffers allocated` line), 0 when none or unknown.
    """

    max_mamba_cache_size: int
    kv_tokens: int
    kv_pool_bytes: float
    state_pool_bytes: float | None = None
    draft_kv_pool_bytes: float = 0.0
    draft_kv_tokens: int | None = None
    replayssm_ring_bytes: float = 0.0

    def kv_bytes_per_token(self, page_size: int) -> float:
        """The KV buffers hold #tokens + one padding page."""
        if self.kv_tokens <= 0 or self.kv_pool_bytes <= 0:
            return 0.0
        return self.kv_pool_bytes / (self.kv_tokens + page_size)

    def draft_kv_bytes_per_token(self, page_size: int) -> float:
        tokens = self.kv_tokens if self.draft_kv_tokens is None else self.draft_kv_tokens
        if tokens <= 0 or self.draft_kv_pool_bytes <= 0:
            return 0.0
        return self.draft_kv_pool_bytes / (tokens + page_size)


@dataclass(frozen=True)
class InvertedPools:
    """Byte constants and the per-GPU budget of both pools, or what is missing to give them."""

    constants: ByteConstants | None
    rest_bytes: float | None
    state_from: str  # STATE_FROM_*
    missing: str | None = None  # one line naming what could not be derived


def _requested(config: ServingConfig) -> int:
    """`max(1, max_running_requests // attn_dp)` as `_handle_max_mamba_cache` reads it (spec/ReplaySSM paths,
    where SGLang has always resolved max_running_requests; its spec default is 48)."""
    mrr = config.max_running_requests if config.max_running_requests is not None else SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    return max(1, mrr // config.attn_dp_size)


def _ratio_based(config: ServingConfig) -> bool:
    """Whether the slot count came from the ratio (not pinned, not one slot per request with radix off)."""
    if config.max_mamba_cache_size is not None:
        return False
    return not (config.disable_radix_cache and requested_cap(config) is not None)


@dataclass(frozen=True)
class _Terms:
    """The ratio branch of `_handle_max_mamba_cache` as linear functions of the slot bytes `ps`:
    the state budget that gives slot count K is [lo(ps), lo(ps) + width(ps)), and the budget spent on state
    (persistent + reserved spec scratch + rings) is spent(ps)."""

    lo_per_ps: float
    lo_fixed: float
    width_per_ps: float
    width_fixed: float
    spent_per_ps: float
    spent_fixed: float


def _ring_bytes(config: ServingConfig, ring_per_request: float) -> tuple[float, float]:
    """ReplaySSM's ring as (bytes per slot, fixed bytes): KDA rides it on every slot, GDN keeps a fixed scratch for
    the requested running requests + 1."""
    if not (replayssm_active(config) and ring_per_request > 0):
        return 0.0, 0.0
    if config.linear_family == "kda":
        return ring_per_request, 0.0
    return 0.0, ring_per_request * (_requested(config) + 1)


def _ratio_terms(config: ServingConfig, cache_size: int, ring_per_request: float) -> _Terms:
    slots = slots_per_request(config)
    draft = config.draft_tokens if spec_enabled(config) else 0
    ring_slot, ring_fixed = _ring_bytes(config, ring_per_request)
    k = cache_size
    if reserves_spec_state(config):
        # K = floor((B - ps(1+D) - ring) / (ps(1+D/S) + ring)); reserved scratch ps·(min(mrr, K//S)+1)·D
        capped = min(_requested(config), k // slots)
        return _Terms(
            lo_per_ps=k * (1 + draft / slots) + 1 + draft,
            lo_fixed=(k + 1) * ring_slot,
            width_per_ps=1 + draft / slots,
            width_fixed=ring_slot,
            spent_per_ps=(k + 1) + (capped + 1) * draft,
            spent_fixed=(k + 1) * ring_slot,
        )
    # K = floor((B - fixed - slot) / slot), slot = ps + ring per slot
    return _Terms(
        lo_per_ps=k + 1,
        lo_fixed=(k + 1) * ring_slot + ring_fixed,
        width_per_ps=1.0,
        width_fixed=ring_slot,
        spent_per_ps=k + 1,
        spent_fixed=(k + 1) * ring_slot + ring_fixed,
    )


def _reserved_state_bytes(config: ServingConfig, cache_size: int, per_slot: float, ring_per_request: float) -> float:
    """What the state side took from the budget on the pinned and radix-off paths (persistent, scratch, rings)."""
    slots = slots_per_request(config)
    draft = config.draft_tokens if spec_enabled(config) else 0
    ring_slot, ring_fixed = _ring_bytes(config, ring_per_request)
    scratch = 0.0
    if reserves_spec_state(config):
        if config.max_mamba_cache_size is not None:
            scratch = per_slot * (min(_requested(config), cache_size // slots) + 1) * draft
        else:
            scratch = per_slot * (cache_size + 1) * draft
    return (cache_size + 1) * (per_slot + ring_slot) + ring_fixed + scratch


def invert_pools(
    stages: Sequence[StagePools],
    config: ServingConfig,
    *,
    ring_bytes_per_request: float | None = None,
    state_bytes_per_slot: float | None = None,
    draft_kv_fraction: float | None = None,
) -> InvertedPools:
    """Byte constants and the budget `rest` (per GPU, both pools) from what each PP stage reports.

    `stages` holds one entry per PP stage (one without PP). The KV row that binds is the stage with the most
    attention bytes per token (its token count is the one SGLang's MIN all-reduce keeps); the slot is charged at
    the largest stage's state share. State bytes per slot come, in order, from the state pool's bytes, from
    `state_bytes_per_slot` (the model config), or from the ratio (ratio-based pools only). Under EAGLE/MTP the
    draft's KV rides in each row: from the reported draft pool, else `draft_kv_fraction` x the target's
    (the model config's draft layers / attention layers), else left out, which keeps every count and token_equiv
    right and understates the bytes by that fraction. `rest` is rebuilt so that `split_pools` at the live ratio
    gives back the reported slot count: the KV side's midpoint, moved to the nearest point of the budget
    interval that yields K.
    """
    page = config.page_size
    with_kv = [s for s in stages if s.kv_bytes_per_token(page) > 0]
    if not stages:
        return InvertedPools(None, None, STATE_UNKNOWN, "no pool sizes reported")
    if not with_kv:
        return InvertedPools(None, None, STATE_UNKNOWN, "no KV pool with tokens and bytes reported")
    binding = max(with_kv, key=lambda s: s.kv_bytes_per_token(page))
    cache_size = binding.max_mamba_cache_size
    if cache_size <= 0:
        return InvertedPools(None, None, STATE_UNKNOWN, "the state pool reports no slots")
    kv_per_token = binding.kv_bytes_per_token(page)
    draft_per_token = 0.0
    if spec_enabled(config):
        draft_per_token = binding.draft_kv_bytes_per_token(page)
        if draft_per_token == 0.0 and draft_kv_fraction:
            draft_per_token = kv_per_token * draft_kv_fraction
    cell = kv_per_token + draft_per_token

    ring = 0.0
    if replayssm_active(config):
        if binding.replayssm_ring_bytes > 0:
            divisor = cache_size + 1 if config.linear_family == "kda" else _requested(config) + 1
            ring = binding.replayssm_ring_bytes / divisor
        elif ring_bytes_per_request:
            ring = ring_bytes_per_request

    # The KV pool was cut as floor(remaining / cell), page-aligned down: remaining sat in [tokens, tokens + page)
    # cells; take the middle.
    remaining = (binding.kv_tokens + page / 2) * cell

    per_slot: float | None = None
    state_from = STATE_UNKNOWN
    pooled = [s.state_pool_bytes / (s.max_mamba_cache_size + 1) for s in stages
              if s.state_pool_bytes and s.max_mamba_cache_size > 0]
    if pooled:
        per_slot, state_from = max(pooled), STATE_FROM_POOL
    elif state_bytes_per_slot:
        per_slot, state_from = float(state_bytes_per_slot), STATE_FROM_MODEL
    elif _ratio_based(config):
        q = config.mamba_full_memory_ratio / (1 + config.mamba_full_memory_ratio)
        terms = _ratio_terms(config, cache_size, ring)
        # budget at the middle of K's interval equals q x (remaining + state spent): linear in ps
        denominator = terms.lo_per_ps + terms.width_per_ps / 2 - q * terms.spent_per_ps
        numerator = q * (remaining + terms.spent_fixed) - terms.lo_fixed - terms.width_fixed / 2
        if denominator > 0 and numerator > 0:
            per_slot, state_from = numerator / denominator, STATE_FROM_RATIO
    if per_slot is None or not per_slot > 0:
        return InvertedPools(
            None, None, STATE_UNKNOWN,
            "state bytes per slot: the state pool's size is not reported (or rounds to 0.00 GB) and the slot "
            "count was not set by the ratio; give the model config or state_bytes_per_slot",
        )

    constants = ByteConstants(
        state_bytes_per_slot=per_slot,
        kv_bytes_per_token=kv_per_token,
        draft_kv_bytes_per_token=draft_per_token,
        replayssm_ring_bytes_per_request=ring,
    )
    if _ratio_based(config):
        ratio = config.mamba_full_memory_ratio
        terms = _ratio_terms(config, cache_size, ring)
        rest = remaining + terms.spent_per_ps * per_slot + terms.spent_fixed
        low = (terms.lo_per_ps * per_slot + terms.lo_fixed) * (1 + ratio) / ratio
        width = (terms.width_per_ps * per_slot + terms.width_fixed) * (1 + ratio) / ratio
        # The KV side's estimate, moved to the nearest point inside K's interval when the rounding of the
        # reported GB put it outside (kept clear of the edges so float rounding cannot flip K).
        margin = width * 0.02
        rest = min(max(rest, low + margin), low + width - margin)
    else:
        rest = remaining + _reserved_state_bytes(config, cache_size, per_slot, ring)
    if not math.isfinite(rest) or rest <= 0:
        return InvertedPools(constants, None, state_from, "the pool budget could not be rebuilt")
    return InvertedPools(constants, rest, state_from)
