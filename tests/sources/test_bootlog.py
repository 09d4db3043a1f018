"""Golden tests of the boot-log reader on the vendored fixtures and on composed variants."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.errors import InputError
from advisor.model.pools import split_pools
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
    # the budget is rebuilt so that the split at the logged ratio gives back the logged slot count
    split = split_pools(boot.rest_bytes, boot.serving_config(), boot.constants())
    assert split.max_mamba_cache_size == 301


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


def _line(ranks: str, message: str) -> str:
    return f"[2026-11-29 10:00:46{ranks}] {message}"


def test_pp_stages_are_stages_not_draft_pools():
    """PP0 and PP1 each hold their own layers' pools (one line each per TP rank): neither is a draft model."""
    lines = []
    for pp, (size, kv_tokens) in enumerate(((300, 500000), (280, 480000))):
        for tp in range(2):
            prefix = f" PP{pp} TP{tp}"
            lines += [
                _line(prefix, f"Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: 0.50GB, ssm_state size: 14.00GB "),
                _line(prefix, f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {kv_tokens}, K size: 6.00 GB, V size: 6.00 GB"),
            ]
    lines.append(_line(" PP0 TP0", "max_total_num_tokens=480000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                                   "max_running_requests=60, context_len=262144, available_gpu_mem=5.00 GB"))  # fmt: skip
    boot = parse_boot_log("\n".join(lines))
    assert boot.draft_state_pool is None and boot.draft_kv_pool is None
    assert (boot.pp_ranks_seen, boot.tp_ranks_seen) == (2, 2)
    assert {stage: (s.max_mamba_cache_size, kv.tokens) for stage, (s, kv) in boot.stage_pools.items()} == {
        0: (300, 500000),
        1: (280, 480000),
    }
    assert boot.max_running_requests == 60


def test_post_capture_kv_sizing_supersedes_the_va_upper_bound():
    """0.5.20+ with post-capture sizing: `KV Cache VA upper bound.` first, the backed pool after CUDA-graph
    capture (model_executor/model_runner_components/kv_pool_runtime.py), draft pool likewise."""
    text = "\n".join(
        [
            _line("", "Mamba Cache is allocated. max_mamba_cache_size: 100, conv_state size: 0.10GB, ssm_state size: 2.00GB "),
            _line("", "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 900000, KV size: 20.00 GB"),
            _line("", "Post-capture KV sizing: full_layer_tokens=700000, swa_layer_tokens=0"),
            _line("", "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 700000, KV size: 15.56 GB, avail mem=3.10 GB"),
            _line("", "Post-capture KV sizing: draft KV cache allocated. dtype: torch.bfloat16, #tokens: 700000, KV size: 1.30 GB"),
        ]
    )
    boot = parse_boot_log(text)
    assert (boot.kv_pool.tokens, boot.kv_pool.kv_gib, boot.post_capture_kv) == (700000, 15.56, True)
    assert boot.draft_kv_pool is not None and boot.draft_kv_pool.kv_gib == 1.30
    only_bound = parse_boot_log("\n".join(text.splitlines()[:2]))
    assert only_bound.kv_pool.upper_bound and only_bound.kv_pool.tokens == 900000


def test_052_mamba_line_without_a_size_takes_the_request_pool_size():
    """0.5.2's MambaPool logged no size: it had max_running_requests slots (model_runner.py, size=max_num_reqs)."""
    text = "\n".join(
        [
            _line(" TP0", "Mamba Cache is allocated. conv_state size: 0.20GB, ssm_state size: 6.00GB "),
            _line(" TP0", "KV Cache is allocated. #tokens: 300000, K size: 3.00 GB, V size: 3.00 GB"),
            _line(" TP0", "max_total_num_tokens=300000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                          "max_running_requests=128, context_len=262144, available_gpu_mem=5.00 GB"),
        ]
    )  # fmt: skip
    boot = parse_boot_log(text)
    assert (boot.state_pool.max_mamba_cache_size, boot.state_pool_size_from_caps) == (128, True)
    with pytest.raises(InputError, match="no max_mamba_cache_size"):
        parse_boot_log("\n".join(text.splitlines()[:2]))


def test_labels_with_spaces_trailing_spaces_and_a_line_that_lost_its_bracket():
    text = "\n".join(
        [
            "2026-11-29 10:00:46 TP0] Mamba Cache is allocated. max_mamba_cache_size: 64, conv_state size: 0.10GB, ssm_state size: 2.00GB   ",
            _line(" TP0", "MiniMax MSA-v1 main NVFP4 KV Cache is allocated. dtype: torch.uint8, #tokens: 400000, KV size: 3.00 GB   "),
            _line(" TP0", "max_total_num_tokens=400000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                          "max_running_requests=21, context_len=262144, available_gpu_mem=5.00 GB    "),
        ]
    )  # fmt: skip
    boot = parse_boot_log(text)
    assert (boot.state_pool.max_mamba_cache_size, boot.kv_pool.label, boot.kv_pool.kv_gib) == (64, "MiniMax MSA-v1 main NVFP4", 3.0)
    assert (boot.max_running_requests, boot.available_gpu_mem_gib) == (21, 5.0)


_FRAGMENTS = [
    "[2026-11-29 10:00:46 TP0] ", "[2026-11-29 10:00:46 DP1 PP1 TP3 EP3] ", "2026-11-29 10:00:46 TP1] ", "[Gloo] ",
    "Mamba Cache is allocated. ", "max_mamba_cache_size: ", "conv_state size: ", "ssm_state size: ", "KV Cache is allocated. ",
    "KV Cache VA upper bound. ", "dtype: ", "#tokens: ", "K size: ", "V size: ", "KV size: ", "GB", " GB", "12", "0.5", "-3",
    "1e400", "nan", ", ", " ", "max_total_num_tokens=", "max_running_requests=", "server_args=", "ServerArgs(", "{", "}",
    "(", ")", "[", "]", "'", '"', "=", ":", "Load weight begin. avail mem=", "Load weight end. type=", "Memory pool end. ",
    "Post-capture KV sizing: KV cache allocated. ", "max_running_requests is capped to ", " state slots per request", "\n",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=80))
def test_any_mix_of_boot_fragments_parses_or_is_refused_with_an_input_error(pieces):
    try:
        boot = parse_boot_log("".join(pieces))
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        assert boot.state_pool.max_mamba_cache_size >= 0 and boot.kv_pool.tokens >= 0
