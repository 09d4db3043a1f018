"""The one inversion of SGLang's pool split (`advisor.model.inversion`), against SGLang 0.5.23's own sizing.

The fixtures in tests/fixtures/sizing/ were written by tools/sglang_differential.py from SGLang 0.5.23's own
`_handle_max_mamba_cache`, `_calculate_mamba_ratio`, `resolve_max_num_reqs` and config classes
(`mamba_cache_per_req`), rendered with its log templates; `truth.json` holds what SGLang computed. Paths below
are under python/sglang/srt/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.feeder import constants_from_server_info
from advisor.model.inversion import STATE_FROM_POOL, STATE_FROM_RATIO, StagePools, invert_pools
from advisor.model.pools import GIB, ByteConstants, cell_token_equiv, optimal_ratio_for, split_pools
from advisor.model.serving import ServingConfig
from advisor.model.state_shapes import eagle_draft_kv_bytes_per_token, model_bytes
from advisor.sources.bootlog import read_boot_log
from advisor.sources.hf_config import load_hf_config
from advisor.sources.server_info import parse_server_info

SIZING = Path(__file__).resolve().parents[1] / "fixtures" / "sizing"
CONFIGS = Path(__file__).resolve().parent / "data" / "hf_configs"
TRUTH = json.loads((SIZING / "truth.json").read_text())
SPEC_CASES = ["qwen3next-eagle", "qwen3next-eagle-mrr256", "qwen3next-eagle-replayssm", "kimi-linear-eagle-replayssm"]
PP_CASES = ["qwen3next-pp2", "qwen3next-pp2-eagle", "nemotronh-pp2", "nemotronh-pp4"]


@pytest.mark.parametrize("case", sorted(TRUTH))
def test_boot_log_re_predicts_what_sglang_allocated(case):
    # kv_cache_configurator.py `_handle_max_mamba_cache` ~3229-3409 sized these pools; re-splitting the rebuilt
    # budget at the live ratio must give back its max_mamba_cache_size and `resolve_max_num_reqs`' clamp exactly
    truth = TRUTH[case]
    boot = read_boot_log(SIZING / f"{case}.log")
    config = boot.serving_config()
    split = split_pools(boot.rest_bytes, config, boot.constants(), model_context_len=truth["context_len"])
    assert split.max_mamba_cache_size == truth["max_mamba_cache_size"]
    assert split.max_running_requests == truth["max_running_requests"]
    # state bytes per slot as SGLang charges them: int(mamba_cache_per_req * pp_layer_scale) (~3251-3260)
    assert boot.constants().state_bytes_per_slot == pytest.approx(truth["stage_mamba_cache_per_req"], rel=0.01)
    assert split.kv_capacity_tokens == pytest.approx(truth["kv_tokens"], rel=0.001)


@pytest.mark.parametrize("case", PP_CASES)
def test_every_pp_stage_is_read(case):
    # every stage is charged the largest stage's state share (kv_cache_configurator.py ~3233-3252) and the PP
    # all-reduce MIN keeps the smallest token count (~3106-3116): all stages must be read, not stage 0 only
    boot = read_boot_log(SIZING / f"{case}.log")
    assert boot.pp_ranks_seen == boot.serving_config().pp_size == len(boot.stages)
    assert boot.pools().state_from == STATE_FROM_POOL


def test_nemotronh_pp4_has_a_stage_without_attention_layers():
    # NemotronH-Nano-9B-v2 at PP4: one stage holds no full-attention layer; its KV pool is 0 bytes
    # (pool_configurator.py `DefaultPoolConfigurator.__init__`, `has_kv_on_another_pp_stage`) and it is read all the same
    boot = read_boot_log(SIZING / "nemotronh-pp4.log")
    assert any(stage.kv_pool_bytes == 0 for stage in boot.stages.values())
    assert boot.constants().kv_bytes_per_token > 0


def test_qwen3_next_eagle_boot_counts_the_draft_kv():
    # the numbers: at its own ratio the EAGLE server logged 874 slots and 3.29M tokens; the draft's KV pool
    # (its second `KV Cache is allocated` line) is part of the budget (pool_configurator.py ~259-314)
    boot = read_boot_log(SIZING / "qwen3next-eagle.log")
    assert boot.draft_kv_pool is not None
    split = split_pools(boot.rest_bytes, boot.serving_config(), boot.constants())
    assert (split.max_mamba_cache_size, split.kv_capacity_tokens // 10_000) == (874, 328)


def _arch(case: str) -> str:
    return "KimiLinearForCausalLM" if case.startswith("kimi") else "Qwen3NextForCausalLM"


def _draft_fraction(case: str, info) -> float | None:
    if not info.serving.draft_tokens:
        return None
    name = "Kimi-Linear-48B-A3B-Instruct.json" if case.startswith("kimi") else "Qwen3-Next-80B-A3B-Instruct.json"
    derived = model_bytes(load_hf_config(CONFIGS / name), tp_size=info.serving.tp_size, dcp_size=info.serving.dcp_size)
    return eagle_draft_kv_bytes_per_token(derived, 1) / derived.kv_bytes_per_token


@pytest.mark.parametrize("case", [c for c in sorted(TRUTH) if (SIZING / f"{c}.server_info.json").exists()
                                  and "pp" not in c and "pinned" not in c and "radix-off" not in c])
def test_server_info_inversion_matches_the_boot_log(case):
    # /server_info carries the slot count, the target KV pool's GB (3 places) and the logical token capacity
    # (managers/scheduler_components/internal_state.py ~76-88, memory_usage.py); the joint solve under spec
    # (kv_cache_configurator.py ~3350-3378) is inverted, the draft KV put back from the model config
    info = parse_server_info(json.loads((SIZING / f"{case}.server_info.json").read_text()), architecture=_arch(case))
    ring = None
    if info.serving.replayssm:
        ring = TRUTH[case]["replayssm_ring_bytes_per_req"]
    inverted = constants_from_server_info(info, draft_kv_fraction=_draft_fraction(case, info),
                                          ring_bytes_per_request=ring)
    assert inverted is not None
    constants, _ = inverted
    boot = read_boot_log(SIZING / f"{case}.log")
    assert constants.state_bytes_per_slot == pytest.approx(boot.constants().state_bytes_per_slot, rel=0.01)
    assert constants.state_bytes_per_slot == pytest.approx(TRUTH[case]["stage_mamba_cache_per_req"], rel=0.01)


@pytest.mark.parametrize("case", SPEC_CASES)
def test_server_info_without_the_draft_kv_keeps_token_equiv(case):
    # without the model config the draft KV is unknown: the slot bytes come out low by the draft's share of the
    # row, but token_equiv against the whole row (what r* uses) and the re-predicted counts stay right
    # (a KDA ring rides on every slot, so an unknown ring is folded into the slot the same way)
    info = parse_server_info(json.loads((SIZING / f"{case}.server_info.json").read_text()), architecture=_arch(case))
    constants, rest = constants_from_server_info(info)
    boot = read_boot_log(SIZING / f"{case}.log")
    assert cell_token_equiv(info.serving, constants) == pytest.approx(
        cell_token_equiv(boot.serving_config(), boot.constants()), rel=0.01)
    split = split_pools(rest, info.serving, constants)
    assert split.max_mamba_cache_size == TRUTH[case]["max_mamba_cache_size"]


def test_non_spec_inversion_is_the_closed_form():
    # without spec the joint solve reduces to per_slot = r * remaining / (K + 1.5 + 0.5 r): the middle of the
    # budget interval that yields K (kv_cache_configurator.py ~3380-3386), one padding slot per pool
    config = ServingConfig(mamba_full_memory_ratio=0.9)
    stage = StagePools(max_mamba_cache_size=999, kv_tokens=1_000_000, kv_pool_bytes=(1_000_000 + 1) * 10_000.0)
    inverted = invert_pools([stage], config)
    remaining = (1_000_000 + 0.5) * 10_000.0
    assert inverted.state_from == STATE_FROM_RATIO
    assert inverted.constants.state_bytes_per_slot == pytest.approx(0.9 * remaining / (999 + 1.5 + 0.45))


def test_the_round_trip_holds_across_ratios_and_spec():
    # forward split, report what SGLang would, invert, split again: the same slots and clamp
    for ratio in (0.1, 0.5, 0.9, 2.0):
        for draft in (0, 3):
            config = ServingConfig(mamba_full_memory_ratio=ratio, draft_tokens=draft,
                                   speculative_algorithm="EAGLE" if draft else None)
            constants = ByteConstants(19_316_736.0, 12_288.0, draft_kv_bytes_per_token=1024.0 if draft else 0.0)
            split = split_pools(60 * GIB, config, constants)
            stage = StagePools(
                split.max_mamba_cache_size, split.kv_capacity_tokens,
                round((split.kv_capacity_tokens + 1) * 12_288 / GIB, 2) * GIB,
                round((split.max_mamba_cache_size + 1) * 19_316_736 / GIB, 2) * GIB,
                round((split.kv_capacity_tokens + 1) * 1024 / GIB, 2) * GIB if draft else 0.0,
            )
            inverted = invert_pools([stage], config)
            back = split_pools(inverted.rest_bytes, config, inverted.constants)
            assert (back.max_mamba_cache_size, back.max_running_requests) == (
                split.max_mamba_cache_size, split.max_running_requests)


def test_nothing_to_invert_is_named():
    config = ServingConfig(max_mamba_cache_size=64)
    tiny = StagePools(max_mamba_cache_size=64, kv_tokens=100_000, kv_pool_bytes=2 * GIB, state_pool_bytes=0.0)
    inverted = invert_pools([tiny], config)
    assert inverted.constants is None and "state bytes per slot" in inverted.missing
    given = invert_pools([tiny], config, state_bytes_per_slot=123_456.0)
    assert given.constants.state_bytes_per_slot == 123_456.0 and given.rest_bytes > 2 * GIB


def test_a_kda_ring_rides_on_every_slot_in_r_star():
    # Kimi-Linear TP2 with ReplaySSM spec-verify: the ring (configs/mamba_utils.py `replayssm_ring_bytes_per_req`,
    # 7,884,800 B at record_len 16) is charged per slot for KDA (kv_cache_configurator.py ~3282-3291), so a slot
    # costs 21.7 + 7.9 MB and r* grows by that share; GDN's ring is fixed scratch and leaves r* alone
    truth = TRUTH["kimi-linear-eagle-replayssm"]
    boot = read_boot_log(SIZING / "kimi-linear-eagle-replayssm.log")
    config = boot.serving_config()
    assert config.linear_family == "kda" and config.replayssm
    constants = boot.constants()
    assert constants.replayssm_ring_bytes_per_request == pytest.approx(truth["replayssm_ring_bytes_per_req"], rel=0.01)
    without_ring = ByteConstants(constants.state_bytes_per_slot, constants.kv_bytes_per_token,
                                 constants.draft_kv_bytes_per_token)
    gain = optimal_ratio_for(config, constants, 100_000) / optimal_ratio_for(config, without_ring, 100_000)
    assert gain == pytest.approx(1 + 7_884_800 / 21_708_800, rel=0.01)
    gdn = ServingConfig(linear_family="gdn", replayssm=True, draft_tokens=4, speculative_algorithm="EAGLE")
    assert optimal_ratio_for(gdn, constants, 100_000) == optimal_ratio_for(gdn, without_ring, 100_000)


def test_unified_memory_cap_is_the_state_pools_clamp():
    # unified memory: `_handle_max_mamba_cache` still sizes K and `resolve_max_num_reqs` still clamps to K // S;
    # the cap that admits what the shared budget holds is S x rest / ((S + D) slot + L cell)
    from advisor.model.pools import balanced_concurrency, unified_memory_cap

    constants = ByteConstants(19_316_736.0, 12_288.0)
    config = ServingConfig(unified_memory=True, mamba_full_memory_ratio=0.1)
    cap = unified_memory_cap(60 * GIB, config, constants, 8192)
    assert cap.live_cap == split_pools(60 * GIB, config, constants).max_running_requests
    held = balanced_concurrency(60 * GIB, config, constants, 8192)
    assert cap.supported_concurrency == held and cap.recommended_max_mamba_cache_size == int(held) * 5
    assert cap.cap_binds


def test_a_pd_prefill_server_reserves_no_spec_state():
    # kv_cache_configurator.py ~172-181 `_pd_prefill_skips_mamba_spec_state`: prefill never verifies drafts, so
    # `reserves_spec_state` is off (~3294-3298) and the ratio branch sizes K like non-spec; unified memory keeps it
    constants = ByteConstants(19_316_736.0, 12_288.0)
    spec = dict(speculative_algorithm="EAGLE", draft_tokens=4)
    decode = split_pools(60 * GIB, ServingConfig(**spec), constants)
    prefill = split_pools(60 * GIB, ServingConfig(**spec, disaggregation_mode="prefill"), constants)
    plain = split_pools(60 * GIB, ServingConfig(), constants)
    assert prefill.intermediate_bytes == 0 and prefill.max_mamba_cache_size == plain.max_mamba_cache_size
    assert decode.intermediate_bytes > 0 and decode.max_mamba_cache_size < plain.max_mamba_cache_size
    unified = split_pools(60 * GIB, ServingConfig(**spec, disaggregation_mode="prefill", unified_memory=True), constants)
    assert unified.intermediate_bytes > 0
