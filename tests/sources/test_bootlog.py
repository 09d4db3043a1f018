"""Golden tests of the boot-log reader on the vendored fixtures and on composed variants."""

from pathlib import Path

import pytest

from advisor.errors import InputError
from advisor.sources.bootlog import parse_boot_log, read_boot_log

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_seed_boot_log():
    boot = read_boot_log(LOGS / "boot-tp8-default.log")
    assert boot.state_pool.max_mamba_cache_size == 257
    assert boot.state_pool.persistent_gib == pytest.approx(13.50)
    assert boot.kv_pool.tokens == 1167552
    assert boot.kv_pool.dtype == "torch.float8_e4m3fn"
    assert boot.max_running_requests == 51
    assert boot.capped_by_state_pool and boot.logged_slots_per_request == 5
    assert boot.tp_ranks_seen == 8
    assert boot.memory_pool_end_avail_gib == pytest.approx(31.84)
    assert boot.server_args["mamba_full_memory_ratio"] == 0.9
    assert boot.server_args["kv_cache_dtype"] == "fp8_e4m3"
    assert boot.server_args_form == "dict"
    assert boot.server_args["max_running_requests"] is None  # a Python None in the dict, not the text
    assert boot.server_args["uvicorn_access_log_exclude_prefixes"] == []
    # exact per-slot bytes count the padding slot; the seed's X/N convention is 0.4% higher
    assert boot.constants().token_equiv == pytest.approx(4080, rel=0.005)
    assert boot.rest_bytes / 2**30 == pytest.approx(28.53)


def test_kv_bound_single_gpu_boot_with_k_and_v_sizes():
    boot = read_boot_log(LOGS / "runtime-kvbound-single.log")
    assert boot.model_class == "Qwen3NextForCausalLM"
    assert boot.kv_pool.kv_gib == pytest.approx(10.0)
    assert boot.state_pool.max_mamba_cache_size == 555
    assert boot.max_running_requests == 138
    assert not boot.capped_by_state_pool
    assert boot.tp_ranks_seen == 1


def test_last_complete_boot_wins_and_incomplete_is_ignored():
    first = (LOGS / "boot-tp8-default.log").read_text()
    # 0.5.23 logs server_args as a dict (entrypoints/engine.py _server_args_for_logging)
    assert "'mamba_full_memory_ratio': 0.9," in first
    second = first.replace("max_mamba_cache_size: 257", "max_mamba_cache_size: 451").replace(
        "'mamba_full_memory_ratio': 0.9,", "'mamba_full_memory_ratio': 5.97,"
    )
    crashed = "[2026-11-29 11:00:00 TP0] Load weight begin. avail mem=177.53 GB\n"
    boot = parse_boot_log(first + second + crashed)
    assert boot.boots_in_file == 3
    assert boot.state_pool.max_mamba_cache_size == 451
    assert boot.server_args["mamba_full_memory_ratio"] == 5.97


def test_dp_prefixes_uvicorn_noise_and_a_draft_pool():
    text = "\n".join(
        [
            "[2026-11-29 10:00:00] INFO:     127.0.0.1:40112 - \"GET /metrics HTTP/1.1\" 200 OK",
            "[2026-11-29 10:00:46 DP1 TP4 EP4] Mamba Cache is allocated. max_mamba_cache_size: 300, conv_state size: 0.50GB, ssm_state size: 14.00GB ",
            "[2026-11-29 10:00:46 DP0 TP0 EP0] Mamba Cache is allocated. max_mamba_cache_size: 301, conv_state size: 0.50GB, ssm_state size: 14.00GB intermediate_ssm_state_cache size: 2.00GB intermediate_conv_window_cache size: 0.10GB ",
            "[2026-11-29 10:00:46 DP0 TP0 EP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 500000, K size: 6.00 GB, V size: 6.00 GB",
            "[2026-11-29 10:00:47 DP0 TP0 EP0] Mamba Cache is allocated. max_mamba_cache_size: 301, conv_state size: 0.05GB, ssm_state size: 1.40GB ",
            "[2026-11-29 10:00:47 DP0 TP0 EP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 500000, KV size: 1.00 GB",
            "[2026-11-29 10:00:48 DP0 TP0 EP0] max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=262144, available_gpu_mem=5.00 GB",
        ]
    )
    boot = parse_boot_log(text)
    assert boot.state_pool.max_mamba_cache_size == 301
    assert boot.state_pool.intermediate_ssm_gib == pytest.approx(2.0)
    assert boot.kv_pool.kv_gib == pytest.approx(12.0)
    assert boot.draft_kv_pool is not None and boot.draft_kv_pool.kv_gib == pytest.approx(1.0)
    assert boot.draft_state_pool is not None
    assert boot.max_running_requests == 48
    assert boot.dp_ranks_seen == 2
    # rest counts the spec scratch in the state pool
    assert boot.rest_bytes / 2**30 == pytest.approx(0.5 + 14.0 + 2.0 + 0.1 + 12.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no SGLang boot lines"),
        ("[2026-11-29 10:00:46] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 10, KV size: 1.00 GB\n", "Mamba Cache is allocated"),
        (
            "[2026-11-29 10:00:46] Mamba Cache is allocated. max_mamba_cache_size: 3, conv_state size: 0.50GB, ssm_state size: 14.00GB \n",
            "KV Cache is allocated",
        ),
    ],
)
def test_missing_lines_are_named(text, message):
    with pytest.raises(InputError, match=message):
        parse_boot_log(text)


def test_unreadable_file(tmp_path):
    with pytest.raises(InputError, match="cannot read boot log"):
        read_boot_log(tmp_path / "absent.log")
