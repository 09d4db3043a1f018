"""SGLang log-line formatting, checked line for line against the vendored fixture logs."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from advisor.model.pools import GIB
from advisor.model.serving import ServingConfig
from advisor.scheduler.types import DecodeTick, PrefillBatch, RequestFinished, Retraction
from advisor.sim import sglang_logs
from advisor.sim.exposition import SchedulerRank, scheduler_ranks

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
PREFIX = re.compile(r"^\[(?P<ts>[\d-]+ [\d:]+)(?P<ranks>[^\]]*)\] (?P<msg>.*)$")


def messages(text: str) -> list[tuple[str, str]]:
    out = []
    for raw in text.splitlines():
        m = PREFIX.match(raw)
        if m:
            out.append((m.group("ranks"), m.group("msg")))
    return out


def seed_figures(**overrides) -> sglang_logs.BootFigures:
    """The seed's TP8 boot (fixtures/logs/boot-tp8-default.log)."""
    values = dict(
        model_path="example/hybrid-moe",
        model_class="ExampleHybridForCausalLM",
        server_args={"model_path": "example/hybrid-moe", "tp_size": 8, "max_running_requests": None},
        startup_available_gb=177.53,
        weight_gb=114.35,
        load_elapsed_s=41.27,
        max_mamba_cache_size=257,
        state_bytes_per_slot=13.50 * GIB / 258,
        intermediate_bytes=0.0,
        kv_tokens=1167552,
        kv_bytes_per_token=15.03 * GIB / 1167553,
        kv_cache_dtype="fp8_e4m3",
        page_size=1,
        max_running_requests=51,
        clamped_by_state_pool=True,
        slots_per_request=5,
        requested_max_running_requests=None,
        chunked_prefill_size=8192,
        max_prefill_tokens=16384,
        context_len=262144,
        graph_decode_gb=1.73,
        cuda_graph_bs=(1, 2, 4, 8, 16, 24, 32, 40, 48, 56),
        quant="fp8",
    )
    values.update(overrides)
    return sglang_logs.BootFigures(**values)


def test_rank_prefixes():
    def prefix(serving: ServingConfig) -> list[str]:
        return [sglang_logs.rank_prefix(r, tp_size=serving.tp_size, pp_size=serving.pp_size) for r in scheduler_ranks(serving)]

    assert prefix(ServingConfig()) == [""]
    assert prefix(ServingConfig(tp_size=2)) == [" TP0", " TP1"]
    assert prefix(ServingConfig(tp_size=2, dp_size=2)) == [" DP0 TP0", " DP0 TP1", " DP1 TP0", " DP1 TP1"]
    assert prefix(ServingConfig(tp_size=2, pp_size=2))[:3] == [" PP0 TP0", " PP0 TP1", " PP1 TP0"]
    assert prefix(ServingConfig(dp_size=2)) == [" DP0", " DP1"]


def test_boot_block_reproduces_the_seed_boot_log_pool_lines():
    fixture = messages((LOGS / "boot-tp8-default.log").read_text())
    ranks = scheduler_ranks(ServingConfig(tp_size=8))
    ours = messages("\n".join(sglang_logs.boot_block(seed_figures(), ranks, tp_size=8, ready_at=1.8e9)))
    kinds = ("Load weight begin", "Load weight end", "Mamba Cache is allocated", "KV Cache is allocated",
             "max_running_requests is capped")  # fmt: skip
    for kind in kinds:
        want = [m for m in fixture if m[1].startswith(kind)]
        got = [m for m in ours if m[1].startswith(kind)]
        assert want and got == want, kind
    # free memory after the pools depends on what else the fixture's GPU held; the form is the same
    graph_end = [(r, m.split("avail mem=")[0]) for r, m in ours if m.startswith("Capture cuda decode CUDA graph end")]
    assert graph_end == [(r, m.split("avail mem=")[0]) for r, m in fixture if m.startswith("Capture cuda decode CUDA graph end")]
    # the mamba line keeps SGLang's quirks: no space before GB, no comma after the ssm size, trailing space
    mamba = next(m for _, m in ours if m.startswith("Mamba"))
    assert mamba.endswith("ssm_state size: 13.04GB ")
    caps = [m for m in ours if m[1].startswith("max_total_num_tokens=")]
    assert [r for r, _ in caps] == [" TP0"]
    assert caps[0][1].startswith(
        "max_total_num_tokens=1167552, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=51, "
        "context_len=262144, available_gpu_mem="
    )
    assert ours[-1] == ("", sglang_logs.READY_LINE)
    # 0.5.20+ logs the resolved dict (entrypoints/engine.py), as the fixture does
    assert ours[0][1] == "server_args={'model_path': 'example/hybrid-moe', 'tp_size': 8, 'max_running_requests': None}"
    assert fixture[0][1].startswith("server_args={'model_path': 'example/hybrid-moe', ")


def test_boot_block_bf16_prints_k_and_v_sizes_and_no_cap_warning_when_kv_bound():
    fixture = messages((LOGS / "runtime-kvbound-single.log").read_text())
    figures = seed_figures(
        max_mamba_cache_size=555, state_bytes_per_slot=39.98 * GIB / 556, kv_tokens=436906,
        kv_bytes_per_token=10.00 * GIB / 436907, kv_cache_dtype="auto", clamped_by_state_pool=False,
        max_running_requests=138, slots_per_request=4, conv_state_fraction=0.92 / 39.98,
    )  # fmt: skip
    ours = messages("\n".join(sglang_logs.boot_block(figures, scheduler_ranks(ServingConfig()), tp_size=1, ready_at=1.8e9)))
    for kind in ("KV Cache is allocated", "Mamba Cache is allocated"):
        assert [m for m in ours if m[1].startswith(kind)] == [m for m in fixture if m[1].startswith(kind)], kind
    assert not any("capped" in m for _, m in ours)


def test_intermediate_state_and_kv_reduction_lines():
    figures = seed_figures(intermediate_bytes=2.0 * GIB, clamped_by_state_pool=False, requested_max_running_requests=64,
                           max_running_requests=40)  # fmt: skip
    text = "\n".join(sglang_logs.boot_block(figures, [SchedulerRank(0, None, 0, 0, True, 1)], tp_size=1, ready_at=1.8e9))
    assert "intermediate_ssm_state_cache size: 1.93GB intermediate_conv_window_cache size: 0.07GB \n" in text + "\n"
    assert "max_running_requests was reduced from the requested 64 to 40 (per dp worker) due to the available KV cache capacity." in text


def _local(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%d %H:%M:%S").timestamp()


def test_decode_and_prefill_lines_match_the_fixture_form_exactly():
    text = (LOGS / "runtime-kvbound-single.log").read_text().splitlines()
    decode = next(line for line in text if "Decode batch" in line)
    prefill = next(line for line in text if "Prefill batch" in line)
    nums = [float(x) for x in re.findall(r"(?<=: )[\d.]+", decode)]
    tick = DecodeTick(
        time=0.0, running_requests=int(nums[0]), kv_used_tokens=int(nums[1]), full_token_usage=nums[2],
        mamba_used_slots=int(nums[3]), mamba_usage=nums[4], gen_throughput=nums[5], queued_requests=int(nums[6]),
    )  # fmt: skip
    ts = PREFIX.match(decode).group("ts")
    assert sglang_logs.line(_local(ts), sglang_logs.decode_line(tick)) == decode
    p = [float(x) for x in re.findall(r"(?<=: )[\d.]+", prefill)]
    batch = PrefillBatch(
        time=0.0, new_seqs=int(p[0]), new_tokens=int(p[1]), cached_tokens=int(p[2]), full_token_usage=p[3],
        mamba_usage=p[4], running_requests=int(p[5]), queued_requests=int(p[6]), input_throughput=p[8],
    )  # fmt: skip
    ts = PREFIX.match(prefill).group("ts")
    assert sglang_logs.line(_local(ts), sglang_logs.prefill_line(batch, pending_tokens=int(p[7]))) == prefill


def test_retraction_line_forms():
    fixture = (LOGS / "runtime-kvbound-single.log").read_text().splitlines()
    line = next(x for x in fixture if "Retract requests" in x)
    n, gained, mamba, before, after = re.search(
        r"#retracted_reqs: (\d+), #new_tokens_gained: (\d+), #mamba_num_gained: (\d+), #new_token_ratio: ([\d.]+) -> ([\d.]+)", line
    ).groups()
    event = Retraction(0.0, int(n), 1000, 10, int(gained), int(mamba), float(before), float(after))
    assert sglang_logs.line(_local(PREFIX.match(line).group("ts")), sglang_logs.retraction_line(event)) == line
    old = sglang_logs.retraction_line(event, profile="0.5.10")
    assert "#mamba_num_gained" not in old and old.endswith(f"#new_token_ratio: {before} -> {after}")


def test_request_json_line_matches_the_fixture():
    """The fixture's requests finished by length (a benchmark client's: max_tokens set to the output it wants)."""
    first = (LOGS / "requests-json.log").read_text().splitlines()[0]
    event = RequestFinished(
        time=0.0, rid="0" * 32, prompt_tokens=1194, completion_tokens=319, cached_tokens=137, num_retractions=0,
        queue_time=0.1, e2e_latency=6.73881, max_new_tokens=319,
    )  # fmt: skip
    wall = datetime(2026, 11, 29, 15, 0, 1, 46830).timestamp()
    assert sglang_logs.request_json_line(event, wall, stream=False) == first


def test_request_json_line_shows_the_sampling_params_from_level_1_and_stops_before_the_cap():
    event = RequestFinished(
        time=0.0, rid="r", prompt_tokens=1194, completion_tokens=319, cached_tokens=0, num_retractions=0,
        queue_time=0.1, e2e_latency=6.7, max_new_tokens=1024,
    )  # fmt: skip
    context = 262144  # max_req_len: a client without max_tokens is capped at max_req_len - input - 1
    unset = dataclasses.replace(event, max_new_tokens=context - event.prompt_tokens - 1)
    assert sglang_logs.client_max_new_tokens(event, context) == 1024
    assert sglang_logs.client_max_new_tokens(unset, context) is None

    def record(of: RequestFinished, level: int) -> dict:
        line = sglang_logs.request_json_line(of, 0.0, stream=False, level=level,
                                             client_max_new_tokens=sglang_logs.client_max_new_tokens(of, context))
        return json.loads(line.split("] ", 1)[1])

    assert "sampling_params" not in record(event, 0)["obj"]
    assert record(event, 2)["obj"]["sampling_params"]["max_new_tokens"] == 1024
    assert record(event, 2)["out"]["meta_info"]["finish_reason"]["type"] == "stop"  # 319 tokens, then EOS
    assert record(unset, 2)["obj"]["sampling_params"]["max_new_tokens"] is None
    capped = dataclasses.replace(event, completion_tokens=1024)
    reason = json.loads(sglang_logs.request_json_line(capped, 0.0, stream=False).split("] ", 1)[1])
    assert reason["out"]["meta_info"]["finish_reason"] == {"type": "length", "length": 1024}


def test_access_and_deprecation_lines():
    assert sglang_logs.access_line(_local("2026-11-29 10:02:01"), "127.0.0.1:40112", "GET", "/metrics", 200) == (
        '[2026-11-29 10:02:01] INFO:     127.0.0.1:40112 - "GET /metrics HTTP/1.1" 200 OK'
    )
    assert "Please use '/server_info' instead." in sglang_logs.deprecation_line(0.0, "/get_server_info", "/server_info")


@pytest.mark.parametrize("dtype,torch", [("fp8_e4m3", "torch.float8_e4m3fn"), ("fp8_e5m2", "torch.float8_e5m2"),
                                         ("auto", "torch.bfloat16"), ("bf16", "torch.bfloat16")])  # fmt: skip
def test_kv_dtype_names(dtype, torch):
    assert sglang_logs.torch_kv_dtype(dtype) == torch


def test_an_0511_boot_block_has_the_repr_server_args_no_dtype_and_no_clamp_warning():
    """0.5.11's formats, as the real log tests/fixtures/real/011-… shows them line for line."""
    real = (Path(__file__).resolve().parents[1] / "fixtures" / "real" / "011-qwen3.6-27b-awq-v0.5.11-rocm-tp2-full.log")
    real_messages = messages(real.read_text())
    figures = seed_figures(
        release="0.5.11", max_mamba_cache_size=40, kv_tokens=422310, kv_cache_dtype="auto",
        state_bytes_per_slot=5.88 * GIB / 41, kv_bytes_per_token=6.44 * GIB / 422311, conv_state_fraction=0.11 / 5.88,
        max_running_requests=13, slots_per_request=3,
    )  # fmt: skip
    ours = messages("\n".join(sglang_logs.boot_block(figures, scheduler_ranks(ServingConfig(tp_size=2)), tp_size=2,
                                                     ready_at=1.8e9)))  # fmt: skip
    assert ours[0][1] == "server_args=ServerArgs(model_path='example/hybrid-moe', tp_size=8, max_running_requests=None)"
    kv = [m for m in ours if m[1].startswith("KV Cache is allocated")]
    assert kv and sorted(kv) == sorted(m for m in real_messages if m[1].startswith("KV Cache is allocated"))
    mamba = [m for m in ours if m[1].startswith("Mamba Cache is allocated")]
    assert sorted(mamba) == sorted(m for m in real_messages if m[1].startswith("Mamba Cache is allocated"))
    assert not any("is capped to" in m for _, m in ours)  # before 0.5.20 the clamp shows only in the caps line
    assert any(m.startswith("max_total_num_tokens=422310, ") and "max_running_requests=13," in m for _, m in ours)
