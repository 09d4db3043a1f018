"""Pool rules where SGLang 0.5.23 differs from the seed's simple reading (issue 9).

Each test names the SGLang 0.5.23 source it mirrors (paths under python/sglang/srt/); the expected numbers
are worked by hand from those rules, not from our implementation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.errors import InputError
from advisor.model.pools import GIB, ByteConstants, optimal_ratio, optimal_ratio_for, split_pools
from advisor.model.serving import (
    SKIP_SOURCE_ASSUMED,
    SKIP_SOURCE_CONFIG,
    ServingConfig,
    effective_draft_tokens,
    extra_buffer_capable,
    resolve_strategy,
    slots_assumption,
    slots_per_request,
)
from advisor.model.state_shapes import dcp_kv_gain, model_bytes, pp_charged_share, pp_stage_bounds
from advisor.sources.hf_config import load_hf_config

CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs"
QWEN3_NEXT = "Qwen3-Next-80B-A3B-Instruct.json"  # 48 layers, attention every 4th, 2 KV heads x 256
KIMI_LINEAR = "Kimi-Linear-48B-A3B-Instruct.json"  # MLA attention

STATE = 50e6
KV = 10e3
REST = 40 * GIB


# --- strategy and S ------------------------------------------------------------------------------


def test_auto_resolves_before_pp_turns_overlap_off():
    # arg_groups/pipeline.py:225 (handle_model_specific_adjustments -> overrides.py:477-486
    # `_mamba_radix_cache_resolution`) runs before pipeline.py:302 (`_pipeline_parallel_overlap_disable`):
    # auto sees overlap still wanted -> extra_buffer; then PP turns overlap off -> 3 + 1 tracking slot.
    config = ServingConfig(pp_size=2)
    assert resolve_strategy(config) == "extra_buffer"
    assert slots_per_request(config) == 4
    # An explicit --disable-overlap-schedule is seen by auto: no_buffer, S = 3.
    assert resolve_strategy(ServingConfig(pp_size=2, disable_overlap_schedule=True)) == "no_buffer"
    assert slots_per_request(ServingConfig(pp_size=2, disable_overlap_schedule=True)) == 3


def test_lfm2_is_not_extra_buffer_capable():
    # arg_groups/overrides.py:401-436 `_MAMBA_EXTRA_BUFFER_ARCHS` has no Lfm2*, and
    # `supports_mamba_cache_extra_buffer` also requires the triton linear-attention backend.
    assert not extra_buffer_capable("Lfm2ForCausalLM")
    assert not extra_buffer_capable("Lfm2MoeForCausalLM")
    assert extra_buffer_capable("Qwen3NextForCausalLM")
    assert extra_buffer_capable("NemotronHForCausalLM")
    assert not extra_buffer_capable("Qwen3NextForCausalLM", linear_attn_backend="flashinfer")
    lfm2 = ServingConfig(supports_extra_buffer=extra_buffer_capable("Lfm2ForCausalLM"))
    assert resolve_strategy(lfm2) == "no_buffer"
    assert slots_per_request(lfm2) == 3
    # paging does not rescue it either (overrides.py:480: the capability gates both reasons)
    assert resolve_strategy(ServingConfig(page_size=64, supports_extra_buffer=False)) == "no_buffer"


def test_assumed_s_says_so_and_config_overrides_it():
    # managers/scheduler_components/internal_state.py:140-142: env_vars only with SGLANG_EXPOSE_OWN_ENV_VARS,
    # so the skip (kv_cache_configurator.py:3062-3088, `_calculate_mamba_ratio`) is assumed off by default.
    assumed = slots_assumption(ServingConfig())
    assert (assumed.slots, assumed.skip_decode_lock, assumed.source) == (5, False, SKIP_SOURCE_ASSUMED)
    assert assumed.slots_if_other == 4
    assert "SGLANG_EXPOSE_OWN_ENV_VARS" in assumed.reason and "assumed off" in assumed.reason
    told = ServingConfig(strategy="extra_buffer_lazy").with_skip_decode_lock(True)
    stated = slots_assumption(told)
    assert (stated.slots, stated.source, stated.slots_if_other) == (3, SKIP_SOURCE_CONFIG, 4)
    assert "advisor config" in stated.reason
    with pytest.raises(ValueError, match="skip_decode_lock_source"):
        ServingConfig(skip_decode_lock_source="guess")


# --- the split -------------------------------------------------------------------------------------


def test_disable_radix_cache_with_max_running_requests_pins_one_slot_per_request():
    # kv_cache_configurator.py `_handle_max_mamba_cache`, the `disable_radix_cache and
    # max_running_requests is not None` branch: max_mamba_cache_size = max(1, mrr // attn_dp), no ratio.
    constants = ByteConstants(STATE, KV)
    for ratio in (0.5, 3.0):
        config = ServingConfig(
            disable_radix_cache=True, max_running_requests=64, attn_dp_size=2, mamba_full_memory_ratio=ratio
        )
        split = split_pools(REST, config, constants)
        assert split.ratio is None
        assert split.max_mamba_cache_size == 32
        assert split.max_running_requests == 32  # S = 1
        assert split.state_pool_bytes == 33 * STATE
        assert split.kv_capacity_tokens == int((REST - 33 * STATE) // KV)
    # with spec, the intermediate states are reserved for every slot plus the padding one
    spec = ServingConfig(
        disable_radix_cache=True, max_running_requests=64, attn_dp_size=2, speculative_algorithm="EAGLE", draft_tokens=3
    )
    assert split_pools(REST, spec, constants).intermediate_bytes == STATE * 33 * 3


def test_replayssm_ring_gdn_is_fixed_kda_is_per_slot():
    # kv_cache_configurator.py `_handle_max_mamba_cache`: GDN replay is fixed request scratch
    # (ring * (mrr // attn_dp + 1)); KDA replay stays on each slot; the per-request D reservation goes.
    ring = 4e6
    constants = ByteConstants(STATE, KV, replayssm_ring_bytes_per_request=ring)
    base = {"strategy": "extra_buffer", "speculative_algorithm": "EAGLE", "draft_tokens": 3, "replayssm": True,
            "max_running_requests": 40, "mamba_full_memory_ratio": 1.0}
    budget = REST / 2
    gdn = split_pools(REST, ServingConfig(linear_family="gdn", **base), constants)
    fixed = ring * (40 + 1)
    assert gdn.max_mamba_cache_size == int((budget - fixed - STATE) // STATE)
    assert gdn.intermediate_bytes == 0
    assert gdn.state_pool_bytes == (gdn.max_mamba_cache_size + 1) * STATE + fixed
    kda = split_pools(REST, ServingConfig(linear_family="kda", **base), constants)
    assert kda.max_mamba_cache_size == int((budget - (STATE + ring)) // (STATE + ring))
    assert kda.state_pool_bytes == (kda.max_mamba_cache_size + 1) * (STATE + ring)


def test_replayssm_is_inert_outside_gdn_and_kda():
    # kv_cache_configurator.py: `replayssm_active = enable_linear_replayssm_spec and (hybrid_gdn_config
    # is not None or hybrid_kda_config is not None)`; a Mamba2 model keeps D and its intermediate states.
    mamba2 = ServingConfig(speculative_algorithm="EAGLE", draft_tokens=4, replayssm=True, linear_family="mamba2")
    gdn = ServingConfig(speculative_algorithm="EAGLE", draft_tokens=4, replayssm=True, linear_family="gdn")
    assert effective_draft_tokens(mamba2) == 4
    assert effective_draft_tokens(gdn) == 0
    assert split_pools(REST, mamba2, ByteConstants(STATE, KV)).intermediate_bytes > 0


def test_draft_kv_is_part_of_the_token_cell():
    # model_executor/pool_configurator.py `DefaultPoolConfigurator.__init__` (EAGLE/STANDALONE):
    # cell += int(cell * draft_layers / layers), and tokens = budget // cell. One MTP layer over 12.
    draft = KV / 12
    constants = ByteConstants(STATE, KV, draft_kv_bytes_per_token=draft)
    spec = ServingConfig(
        strategy="extra_buffer", speculative_algorithm="EAGLE", draft_tokens=2, max_running_requests=8
    )
    split = split_pools(REST, spec, constants)
    assert split.kv_capacity_tokens == int(split.kv_pool_bytes // (KV + draft))
    # without spec the draft term is not charged
    plain = split_pools(REST, ServingConfig(strategy="extra_buffer"), constants)
    assert plain.kv_capacity_tokens == int(plain.kv_pool_bytes // KV)
    # and r* prices a token at the whole cell: (S + D) * state / (kv + draft) * dcp / L
    dcp = ServingConfig(strategy="extra_buffer", speculative_algorithm="EAGLE", draft_tokens=2, dcp_size=4)
    assert optimal_ratio_for(dcp, constants, 8192) == pytest.approx((5 + 2) * STATE / (KV + draft) * 4 / 8192)


# --- byte constants from a model config ----------------------------------------------------------


def test_dcp_kv_heads_and_gain_from_a_model_config():
    # configs/model_config.py:1700-1711 `get_num_kv_heads(tp, dcp)`: max(1, H // (tp // dcp)).
    # Qwen3-Next: H = 2 KV heads of 256 (K and V), 12 attention layers, bf16 -> 2 bytes.
    hf = load_hf_config(CONFIGS / QWEN3_NEXT)
    row = 12 * 2 * (256 + 256)  # bytes per KV head per token over the 12 attention layers
    assert model_bytes(hf, tp_size=8).kv_bytes_per_token == 1 * row  # max(1, 2 // 8)
    assert model_bytes(hf, tp_size=8, dcp_size=8).kv_bytes_per_token == 2 * row  # 2 // (8 // 8)
    assert model_bytes(hf, tp_size=8, dcp_size=2).kv_bytes_per_token == 1 * row  # max(1, 2 // 4)
    # the gain is dcp * heads(tp) / heads(tp / dcp), not dcp
    assert dcp_kv_gain(hf, tp_size=8, dcp_size=8) == pytest.approx(4.0)
    assert dcp_kv_gain(hf, tp_size=8, dcp_size=2) == pytest.approx(2.0)
    assert dcp_kv_gain(hf, tp_size=2, dcp_size=2) == pytest.approx(1.0)  # 2 * 1 / 2
    # MLA's latent is not head-split: the full dcp
    assert dcp_kv_gain(load_hf_config(CONFIGS / KIMI_LINEAR), tp_size=8, dcp_size=8) == pytest.approx(8.0)
    with pytest.raises(InputError, match="dcp_size"):
        model_bytes(hf, tp_size=8, dcp_size=3)


def test_dcp_ratio_from_config_uses_physical_rows():
    # The seed's r* = (S + D) * token_equiv * dcp / L holds with token_equiv on the physical DCP row.
    hf = load_hf_config(CONFIGS / QWEN3_NEXT)
    plain = model_bytes(hf, tp_size=8)
    sharded = model_bytes(hf, tp_size=8, dcp_size=8)
    r_sharded = optimal_ratio(9216, sharded.token_equiv, slots=4, dcp_size=8)
    r_naive = optimal_ratio(9216, plain.token_equiv, slots=4, dcp_size=8)
    assert r_sharded == pytest.approx(r_naive / 2)  # heads(8) = 1 vs heads(1) = 2


def test_pp_charges_the_largest_stage_share():
    # distributed/utils.py:110-150 `get_pp_indices`: the last (48 % 5) = 3 stages take one more layer.
    assert pp_stage_bounds(48, 5) == [(0, 9), (9, 18), (18, 28), (28, 38), (38, 48)]
    assert pp_stage_bounds(10, 2, partition=[3, 7]) == [(0, 3), (3, 10)]
    with pytest.raises(InputError, match="SGLANG_PP_LAYER_PARTITION"):
        pp_stage_bounds(10, 2, partition=[3, 3])
    # kv_cache_configurator.py `_handle_max_mamba_cache`: pp_layer_scale = max stage state layers / all.
    # Qwen3-Next: attention at layers 3, 7, ..., 47. Stage [28, 38) holds 31 and 35 -> 8 GDN layers of 36.
    hf = load_hf_config(CONFIGS / QWEN3_NEXT)
    whole = model_bytes(hf, tp_size=4)
    staged = model_bytes(hf, tp_size=4, pp_size=5)
    assert staged.pp_state_share == pytest.approx(8 / 36)
    assert staged.state_bytes_per_slot == int(whole.state_bytes_per_slot * 8 / 36)
    # KV: the fullest stages ([18, 28) and [38, 48)) hold 3 attention layers of 12
    assert staged.kv_bytes_per_token == whole.kv_bytes_per_token * 3 // 12
    assert pp_charged_share(tuple(range(36)), 48, 1) == 1.0


def test_replayssm_ring_bytes_from_a_model_config():
    # configs/mamba_utils.py:127-157 `replayssm_ring_bytes_per_req`, record_len 16 (exec_.py:582-585).
    from advisor.model.state_shapes import replayssm_ring_bytes_per_request

    qwen = load_hf_config(CONFIGS / QWEN3_NEXT)  # 36 GDN layers; 32 value / 16 key heads of 128
    # TP4: hv 8, h_k 4. bf16: d 8*16*128*2 + k 4*16*128*2 + g 8*16*4 + the two low parts again
    per_layer = 32768 + 16384 + 512 + 32768 + 16384
    assert replayssm_ring_bytes_per_request(qwen, tp_size=4) == per_layer * 36
    # fp32 conv dtype: no low parts, but 4-byte d and k
    assert replayssm_ring_bytes_per_request(qwen, tp_size=4, conv_dtype="float32") == (65536 + 32768 + 512) * 36
    kimi = load_hf_config(CONFIGS / KIMI_LINEAR)  # 20 KDA layers; 32 heads of 128
    # TP4: hv = h_k = 8. raw v, raw k, d, k at bf16 (4 * 32768), beta 8*16*4, vector g 8*16*128*4
    assert replayssm_ring_bytes_per_request(kimi, tp_size=4) == (4 * 32768 + 512 + 65536) * 20
    with pytest.raises(InputError, match="GDN and KDA"):
        replayssm_ring_bytes_per_request(load_hf_config(CONFIGS / "granite-4.0-h-small.json"))


def test_eagle_draft_kv_from_a_model_config():
    # model_executor/pool_configurator.py `DefaultPoolConfigurator.__init__`: cell += int(cell * draft / layers).
    from advisor.model.state_shapes import eagle_draft_kv_bytes_per_token

    qwen = model_bytes(load_hf_config(CONFIGS / QWEN3_NEXT), tp_size=8)  # 12 attention layers
    assert eagle_draft_kv_bytes_per_token(qwen, 1) == qwen.kv_bytes_per_token // 12
    # under PP the fullest stage's attention layers are the denominator (3 of 12 at pp 5)
    staged = model_bytes(load_hf_config(CONFIGS / QWEN3_NEXT), tp_size=8, pp_size=5)
    assert eagle_draft_kv_bytes_per_token(staged, 1) == staged.kv_bytes_per_token // 3


@settings(max_examples=200, deadline=None)
@given(
    ratio=st.floats(min_value=0.05, max_value=20),
    family=st.sampled_from([None, "gdn", "kda", "mamba2"]),
    replay=st.booleans(),
    draft=st.integers(min_value=0, max_value=8),
    draft_kv=st.floats(min_value=0, max_value=KV),
    ring=st.floats(min_value=0, max_value=STATE / 4),
    radix_off=st.booleans(),
)
def test_split_never_spends_more_than_rest(ratio, family, replay, draft, draft_kv, ring, radix_off):
    # Whatever the rule, the pools, the padding slots, rings and intermediate states fit in rest, and the
    # clamp never exceeds what the state pool holds at S slots per request.
    config = ServingConfig(
        mamba_full_memory_ratio=ratio, linear_family=family, replayssm=replay, disable_radix_cache=radix_off,
        speculative_algorithm="EAGLE" if draft else None, draft_tokens=draft,
        max_running_requests=32 if radix_off else None,
    )
    constants = ByteConstants(STATE, KV, draft_kv_bytes_per_token=draft_kv, replayssm_ring_bytes_per_request=ring)
    split = split_pools(REST, config, constants)
    assert split.state_pool_bytes + split.kv_pool_bytes + split.intermediate_bytes <= REST + 1
    assert split.max_running_requests <= split.max_mamba_cache_size // slots_per_request(config)
    assert split.kv_capacity_tokens * (KV + (draft_kv if draft else 0)) <= split.kv_pool_bytes + 1
