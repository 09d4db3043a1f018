"""/server_info: golden tests on the genuine bodies, old-version fallbacks, bad input."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from support import LoopbackServer

from advisor.errors import InputError
from advisor.model.serving import slots_per_request
from advisor.sources.http import HttpClient
from advisor.sources.server_info import fetch_server_info, parse_server_info

SHARED = Path(__file__).resolve().parents[1] / "fixtures"
# Each /server_info body matches a boot log: (body, boot log).
PAIRS = {
    "server_info-tp8-default.json": "boot-tp8-default.log",
    "server_info-single-kvbound.json": "runtime-kvbound-single.log",
}


def _body(name: str) -> dict:
    return json.loads((SHARED / "server_info" / name).read_text())


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_golden_against_the_raw_body_and_the_boot_log(name: str) -> None:
    body = _body(name)
    info = parse_server_info(body)
    serving = info.serving
    assert info.version == body["version"] == "0.5.23"
    assert info.model_name == body["served_model_name"]
    assert serving.strategy == body["mamba_radix_cache_strategy"]
    assert serving.mamba_full_memory_ratio == body["mamba_full_memory_ratio"]
    assert serving.tp_size == body["tp_size"] and serving.dp_size == body["dp_size"]
    assert serving.kv_cache_dtype == body["kv_cache_dtype"]
    assert serving.mamba_ssm_dtype == body["mamba_ssm_dtype"]
    assert serving.mem_fraction_static == body["mem_fraction_static"]
    assert serving.max_mamba_cache_size is None  # the top-level user value; the computed one is per shard
    assert serving.draft_tokens == 0 and not serving.replayssm
    assert len(info.shards) == len(body["internal_states"]) == 1
    shard = info.shards[0]
    state = body["internal_states"][0]
    assert shard.dp_rank == 0
    assert shard.max_mamba_cache_size == state["max_mamba_cache_size"]
    assert shard.effective_max_running_requests == state["effective_max_running_requests_per_dp"]
    assert shard.kv_capacity_tokens == state["memory_usage"]["token_capacity"] == body["max_total_num_tokens"]
    assert shard.kv_cache_gb == state["memory_usage"]["kvcache"]
    assert shard.weight_gb == state["memory_usage"]["weight"]
    assert shard.startup_available_gb == state["memory_usage"]["startup_available"]
    # The same server's boot log prints the same pool sizes and caps.
    boot = (SHARED / "logs" / PAIRS[name]).read_text()
    assert f"max_mamba_cache_size: {shard.max_mamba_cache_size}," in boot
    caps = re.search(r"max_total_num_tokens=(\d+), .*max_running_requests=(\d+)", boot)
    assert caps is not None
    assert (int(caps.group(1)), int(caps.group(2))) == (
        shard.kv_capacity_tokens,
        shard.effective_max_running_requests,
    )
    # And the serving config gives the S that explains the cap: cap = max_mamba_cache_size // S.
    assert shard.max_mamba_cache_size // slots_per_request(serving) == shard.effective_max_running_requests


def test_tp8_default_specifics() -> None:
    info = parse_server_info(_body("server_info-tp8-default.json"))
    assert (info.serving.strategy, info.serving.tp_size, info.serving.kv_cache_dtype) == (
        "extra_buffer",
        8,
        "fp8_e4m3",
    )
    assert slots_per_request(info.serving) == 5  # "5 state slots per request" in its boot log


def test_pre_0_5_16_strategy_name_and_null_fallbacks() -> None:
    body = _body("server_info-single-kvbound.json")
    del body["mamba_radix_cache_strategy"]
    body.update(
        mamba_scheduler_strategy="no_buffer",
        mamba_full_memory_ratio=None,
        page_size=None,
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=4,
        enable_linear_replayssm_spec=True,
        enable_unified_memory=True,
        max_mamba_cache_size=600,
        dp_size=2,
    )
    body["internal_states"] = [copy.deepcopy(body["internal_states"][0]) for _ in range(2)]
    body["internal_states"][1]["max_mamba_cache_size"] = 554
    body["internal_states"][0]["env_vars"] = {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1"}
    info = parse_server_info(body)
    serving = info.serving
    assert serving.strategy == "no_buffer"
    assert serving.mamba_full_memory_ratio == 0.9 and serving.page_size == 1
    assert (serving.speculative_algorithm, serving.draft_tokens, serving.replayssm) == ("EAGLE", 4, True)
    assert serving.unified_memory and serving.skip_decode_lock
    assert serving.max_mamba_cache_size == 600 and serving.dp_size == 2
    assert [(s.dp_rank, s.max_mamba_cache_size) for s in info.shards] == [(0, 555), (1, 554)]


def test_decode_log_interval_and_admission_knobs_are_read_when_shown() -> None:
    body = _body("server_info-tp8-default.json")
    assert parse_server_info(body).decode_log_interval == 40
    info = parse_server_info({**body, "max_prefill_tokens": 16384, "schedule_conservativeness": 0.3})
    assert (info.chunked_prefill_size, info.max_prefill_tokens, info.schedule_conservativeness) == (8192, 16384, 0.3)
    off = parse_server_info({**body, "chunked_prefill_size": -1, "schedule_conservativeness": None})
    assert (off.chunked_prefill_size, off.max_prefill_tokens, off.schedule_conservativeness) == (0, None, None)
    body["decode_log_interval"] = 100
    assert parse_server_info(body).decode_log_interval == 100
    for absent in (None, 0):
        body["decode_log_interval"] = absent
        assert parse_server_info(body).decode_log_interval is None
    body["decode_log_interval"] = "often"
    with pytest.raises(InputError, match="decode_log_interval='often' is not an integer"):
        parse_server_info(body)


def test_model_path_when_no_served_name() -> None:
    body = _body("server_info-tp8-default.json")
    body["served_model_name"] = None
    assert parse_server_info(body).model_name == "example/hybrid-moe"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mamba_radix_cache_strategy": "eager_buffer"}, "unknown mamba_radix_cache_strategy 'eager_buffer'"),
        ({"tp_size": "eight"}, "tp_size='eight' is not an integer"),
        ({"tp_size": 0}, "tp_size must be >= 1"),
        ({"disable_radix_cache": "no"}, "disable_radix_cache='no' is not a boolean"),
        ({"mamba_full_memory_ratio": -1.0}, "mamba_full_memory_ratio must be > 0"),
        ({"internal_states": {"0": {}}}, "internal_states is not a list"),
        (
            {"internal_states": [{"memory_usage": {"token_capacity": 1.5}}]},
            r"token_capacity=1.5 is not an integer",
        ),
    ],
)
def test_bad_bodies_are_input_errors(change: dict, message: str) -> None:
    body = _body("server_info-tp8-default.json")
    body.update(change)
    with pytest.raises(InputError, match=message):
        parse_server_info(body)


def test_not_an_object_is_an_input_error() -> None:
    with pytest.raises(InputError, match="expected a JSON object"):
        parse_server_info([1, 2])  # type: ignore[arg-type]


def test_fetch_falls_back_to_pre_0_5_10_endpoints() -> None:
    info_bytes = (SHARED / "server_info" / "server_info-tp8-default.json").read_bytes()
    routes = {
        "/get_server_info": (200, "application/json", info_bytes, 0.0),
    }
    with LoopbackServer(routes) as server:
        client = HttpClient(timeout_seconds=5)
        result = fetch_server_info(client, server.base_url + "/")
        assert result.ok and isinstance(result.body, dict)
        assert parse_server_info(result.body).shards[0].max_mamba_cache_size == 257
        assert [path for path, _ in server.requests] == ["/server_info", "/get_server_info"]


def test_fetch_prefers_current_endpoints_and_reports_failures() -> None:
    routes = {
        "/server_info": (503, "text/plain", b"starting", 0.0),
    }
    with LoopbackServer(routes) as server:
        client = HttpClient(timeout_seconds=5)
        failed = fetch_server_info(client, server.base_url)
        assert (
            not failed.ok and failed.status == 503 and failed.error is not None and "HTTP 503" in failed.error
        )
        assert [path for path, _ in server.requests] == ["/server_info"]


# --- issue 9: pool rules the body carries --------------------------------------------------------


def test_dcp_token_capacity_is_logical_and_physical_rows_are_split_out() -> None:
    # SGLang 0.5.23 managers/tp_worker.py `get_worker_info` returns `logical_max_total_num_tokens`
    # (model_runner.py: rows * attn_dcp_size, kv_cache_configurator.py `logical_token_capacity`), and
    # internal_state.py puts it in memory_usage.token_capacity; kvcache GB covers the physical rows.
    body = _body("server_info-tp8-default.json")
    body["dcp_size"] = 8
    state = body["internal_states"][0]
    state["memory_usage"]["token_capacity"] = 8 * 1167552
    info = parse_server_info(body)
    shard = info.shards[0]
    assert info.serving.dcp_size == 8
    assert shard.kv_capacity_tokens == 8 * 1167552
    assert shard.kv_capacity_physical_tokens == 1167552
    # bytes per token from the physical rows equal the non-DCP body's
    plain = parse_server_info(_body("server_info-tp8-default.json")).shards[0]
    assert plain.kv_capacity_physical_tokens == plain.kv_capacity_tokens
    assert shard.kv_cache_gb / shard.kv_capacity_physical_tokens == plain.kv_cache_gb / plain.kv_capacity_tokens


def test_graph_memory_sums_the_capture_phases() -> None:
    body = _body("server_info-tp8-default.json")
    graph = body["internal_states"][0]["memory_usage"]["graph"]
    assert parse_server_info(body).shards[0].graph_gb == pytest.approx(sum(graph.values()))
    graph["target_verify"] = "a lot"
    with pytest.raises(InputError, match="graph"):
        parse_server_info(body)


def test_decode_lock_skip_is_assumed_without_env_vars() -> None:
    # internal_state.py:140-142: env_vars only under SGLANG_EXPOSE_OWN_ENV_VARS=1.
    body = _body("server_info-tp8-default.json")
    assert "env_vars" not in body["internal_states"][0]
    serving = parse_server_info(body).serving
    assert (serving.skip_decode_lock, serving.skip_decode_lock_source) == (False, "assumed")
    body["internal_states"][0]["env_vars"] = {"SGLANG_EXPOSE_OWN_ENV_VARS": "1"}
    serving = parse_server_info(body).serving
    assert (serving.skip_decode_lock, serving.skip_decode_lock_source) == (False, "env_vars")
    assert slots_per_request(serving) == 5


def test_architecture_and_backend_decide_extra_buffer_capability() -> None:
    # arg_groups/overrides.py:438-450 `supports_mamba_cache_extra_buffer`: listed architecture AND triton.
    body = _body("server_info-tp8-default.json")
    body["mamba_radix_cache_strategy"] = "auto"
    assert slots_per_request(parse_server_info(body, architecture="Qwen3NextForCausalLM").serving) == 5
    lfm2 = parse_server_info(body, architecture="Lfm2ForCausalLM").serving
    assert (lfm2.supports_extra_buffer, lfm2.linear_family, slots_per_request(lfm2)) == (False, "shortconv", 3)
    body["linear_attn_backend"] = "flashinfer"
    assert slots_per_request(parse_server_info(body, architecture="Qwen3NextForCausalLM").serving) == 3
    assert parse_server_info(body, architecture="Qwen3NextForCausalLM").serving.linear_family == "gdn"
