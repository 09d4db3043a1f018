"""The seed's worked examples, reproduced by the pool arithmetic, plus its properties."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from advisor.model.pools import (
    GIB,
    ByteConstants,
    binding_pool,
    kv_capacity_requests,
    optimal_ratio,
    optimal_ratio_for,
    split_pools,
)
from advisor.model.serving import ServingConfig

# The seed's constants, read off its boot log with the seed's own convention (divide by N).
SEED_STATE = (0.46 + 13.04) * GIB / 257
SEED_KV = 15.03 * GIB / 1167552
SEED_TOKEN_EQUIV = SEED_STATE / SEED_KV
REST = (0.46 + 13.04 + 15.03) * GIB


def test_token_equiv_of_the_worked_example():
    assert SEED_TOKEN_EQUIV == pytest.approx(4080, rel=0.001)
    assert SEED_STATE == pytest.approx(56.4e6, rel=0.001)
    assert SEED_KV == pytest.approx(13.8e3, rel=0.002)


def test_tp_and_dcp_ratios():
    assert optimal_ratio(9216, SEED_TOKEN_EQUIV, slots=4) == pytest.approx(1.8, abs=0.05)
    assert optimal_ratio(9216, SEED_TOKEN_EQUIV, slots=4, dcp_size=8) == pytest.approx(14, abs=0.2)


@pytest.mark.parametrize(
    ("context", "expected"),
    [(2048, 10.0), (4096, 5.0), (8192, 2.5), (32768, 0.62), (65536, 0.31), (131072, 0.16)],
)
def test_reference_ratio_table(context, expected):
    r = optimal_ratio(context, SEED_TOKEN_EQUIV, slots=5)
    decimals = 1 if expected >= 2.5 else 2
    assert round(r, decimals) == pytest.approx(expected)


@pytest.mark.parametrize(("cache_size", "clamp"), [(257, 51), (451, 90), (474, 94)])
def test_clamp_table(cache_size, clamp):
    config = ServingConfig(strategy="extra_buffer", max_mamba_cache_size=cache_size)
    split = split_pools(REST, config, ByteConstants(SEED_STATE, SEED_KV))
    assert split.max_running_requests == clamp
    assert split.clamped_by_state_pool


def test_split_reproduces_the_boot_log():
    # The boot log's own numbers: r = 0.9, default strategy -> 257 slots, 1167552 KV tokens, clamp 51.
    constants = ByteConstants(13.50 * GIB / 258, 15.03 * GIB / 1167553)
    split = split_pools(REST, ServingConfig(mamba_full_memory_ratio=0.9), constants)
    assert split.max_mamba_cache_size == 257
    assert split.max_running_requests == 51
    assert abs(split.kv_capacity_tokens - 1167552) <= 2


def test_predicted_clamp_and_kv_cap_at_r_1_8_match_measurement():
    constants = ByteConstants(13.50 * GIB / 258, 15.03 * GIB / 1167553)
    split = split_pools(REST, ServingConfig(strategy="extra_buffer_lazy", mamba_full_memory_ratio=1.8), constants)
    kv_cap = kv_capacity_requests(split.kv_capacity_tokens, 9216)
    assert abs(split.max_running_requests - 88) <= 3  # measured clamp 88
    assert abs(kv_cap - 87) <= 3  # measured KV cap 87
    assert binding_pool(split.max_running_requests, kv_cap) == "balanced"


def test_replayssm_example():
    # A model whose NOSPEC balance at L ~ 9K is r = 1.0 with S = 5: D = 8 plain spec gives 2.6,
    # ReplaySSM gives back the NOSPEC value.
    token_equiv = 9216 / 5
    constants = ByteConstants(token_equiv * 1000.0, 1000.0)
    spec = ServingConfig(strategy="extra_buffer", speculative_algorithm="EAGLE", draft_tokens=8)
    replay = ServingConfig(strategy="extra_buffer", speculative_algorithm="EAGLE", draft_tokens=8, replayssm=True)
    assert optimal_ratio_for(spec, constants, 9216) == pytest.approx(2.6)
    assert optimal_ratio_for(replay, constants, 9216) == pytest.approx(1.0)


def test_spec_joint_solve_charges_s_plus_d_per_request():
    constants = ByteConstants(SEED_STATE, SEED_KV)
    plain = split_pools(REST, ServingConfig(mamba_full_memory_ratio=2.0), constants)
    spec = split_pools(
        REST, ServingConfig(mamba_full_memory_ratio=2.0, speculative_algorithm="EAGLE", draft_tokens=4, max_running_requests=4096), constants
    )
    # per running request the spec pool pays (S + D) slots instead of S
    assert spec.max_running_requests == pytest.approx(plain.max_running_requests * 5 / 9, rel=0.03)
    assert spec.intermediate_bytes > 0


def test_dcp_spec_prices_the_draft_inside_the_cell():
    # SGLang 0.5.23 model_executor/pool_configurator.py `DefaultPoolConfigurator.__init__`: the draft's KV
    # joins the per-row cell, so the seed's clean x dcp holds on token_equiv = state / (kv + draft).
    constants = ByteConstants(SEED_STATE, SEED_KV, draft_kv_bytes_per_token=SEED_KV / 4)
    config = ServingConfig(strategy="extra_buffer_lazy", dcp_size=8, speculative_algorithm="EAGLE", draft_tokens=4)
    clean = optimal_ratio(9216, SEED_TOKEN_EQUIV, slots=4, draft_tokens=4, dcp_size=8)
    assert optimal_ratio_for(config, constants, 9216) == pytest.approx(clean * 4 / 5)


@given(
    context=st.floats(min_value=256, max_value=1_000_000),
    token_equiv=st.floats(min_value=10, max_value=20_000),
    slots=st.integers(min_value=1, max_value=5),
    draft=st.integers(min_value=0, max_value=8),
    dcp=st.integers(min_value=1, max_value=16),
)
def test_ratio_properties(context, token_equiv, slots, draft, dcp):
    r = optimal_ratio(context, token_equiv, slots, draft, dcp)
    assert optimal_ratio(context * 2, token_equiv, slots, draft, dcp) == pytest.approx(r / 2)
    assert optimal_ratio(context, token_equiv, slots + 1, draft, dcp) > r
    assert optimal_ratio(context, token_equiv, slots, draft, dcp * 2) == pytest.approx(2 * r)
    assert math.isclose(r * context / (token_equiv * dcp), slots + draft, rel_tol=1e-9)


@given(low=st.floats(min_value=0.05, max_value=20), factor=st.floats(min_value=1.01, max_value=5))
def test_clamp_rises_with_ratio(low, factor):
    constants = ByteConstants(SEED_STATE, SEED_KV)
    a = split_pools(REST, ServingConfig(mamba_full_memory_ratio=low), constants)
    b = split_pools(REST, ServingConfig(mamba_full_memory_ratio=low * factor), constants)
    assert b.max_mamba_cache_size >= a.max_mamba_cache_size
    assert b.kv_capacity_tokens <= a.kv_capacity_tokens
    # nothing is lost: both pools (with padding) fit in rest
    assert b.state_pool_bytes + b.kv_pool_bytes <= REST + 1


def test_binding_pool_tolerance():
    assert binding_pool(100, 102) == "balanced"
    assert binding_pool(50, 100) == "state"
    assert binding_pool(100, 50) == "kv"


def test_bad_inputs():
    with pytest.raises(ValueError, match="context length"):
        optimal_ratio(0, 4000, 4)
    with pytest.raises(ValueError, match="rest"):
        split_pools(0, ServingConfig(), ByteConstants(1.0, 1.0))
    with pytest.raises(ValueError):
        ByteConstants(0, 1.0)
