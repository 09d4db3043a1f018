"""The clamps real SGLang servers logged (tests/fixtures/real/011 and 022) equal the model's prediction.

The figures are read straight off the log lines here (not through advisor.sources.bootlog) so that this
checks the pool rules alone: SGLang's `resolve_max_num_reqs` (kv_cache_configurator.py:3119-3172) caps
max_running_requests at max_mamba_cache_size // S, and `_handle_max_mamba_cache` sizes the pools.
"""

from __future__ import annotations

import re

import pytest
from support import REAL

from advisor.model.pools import GIB, ByteConstants, split_pools
from advisor.model.serving import ServingConfig, slots_per_request


def _first(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text)
    assert match is not None, pattern
    return match


def _pools(text: str) -> tuple[int, float, int, float, int]:
    mamba = _first(r"max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, ssm_state size: ([\d.]+)GB", text)
    kv = _first(r"KV Cache is allocated\. #tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB", text)
    caps = _first(r"max_total_num_tokens=(\d+), .*?max_running_requests=(\d+)", text)
    assert int(caps.group(1)) == int(kv.group(1))
    state_gib = float(mamba.group(2)) + float(mamba.group(3))
    kv_gib = float(kv.group(2)) + float(kv.group(3))
    return int(mamba.group(1)), state_gib, int(kv.group(1)), kv_gib, int(caps.group(2))


def test_011_no_buffer_clamp_from_its_server_args():
    # v0.5.11 ROCm, TP2: server_args=ServerArgs(... mamba_scheduler_strategy='no_buffer',
    # disable_overlap_schedule=True ...) -> S = 3; 40 slots -> 13 requests.
    text = next(REAL.glob("011-*.log")).read_text()
    strategy = _first(r"mamba_scheduler_strategy='(\w+)'", text).group(1)
    overlap_off = _first(r"disable_overlap_schedule=(True|False)", text).group(1) == "True"
    cache, _, _, _, clamp = _pools(text)
    config = ServingConfig(strategy=strategy, disable_overlap_schedule=overlap_off, max_mamba_cache_size=cache)
    assert slots_per_request(config) == 3
    split = split_pools(40 * GIB, config, ByteConstants(1e8, 1e4))  # pinned: the bytes do not move the clamp
    assert split.max_running_requests == clamp == 13
    assert split.clamped_by_state_pool


def test_022_pools_and_clamp_at_the_default_ratio():
    # dev11582 (Apr 2026), TP2, no server_args in the excerpt. At the default r = 0.9 the split of the
    # logged pool bytes reproduces both pool sizes; the clamp 62 = 186 // 3 says S = 3 (no_buffer).
    text = next(REAL.glob("022-*.log")).read_text()
    cache, state_gib, tokens, kv_gib, clamp = _pools(text)
    constants = ByteConstants(state_gib * GIB / (cache + 1), kv_gib * GIB / (tokens + 1))
    config = ServingConfig(strategy="no_buffer", disable_overlap_schedule=True)
    split = split_pools((state_gib + kv_gib) * GIB, config, constants)
    assert split.max_mamba_cache_size == cache == 186
    assert split.kv_capacity_tokens == pytest.approx(tokens, abs=2)
    assert split.max_running_requests == clamp == 62
    # the default extra_buffer row (S = 5) would have logged 37
    assert cache // slots_per_request(ServingConfig(strategy="extra_buffer")) == 37 != clamp
