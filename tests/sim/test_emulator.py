"""The emulated SGLang server over real loopback HTTP: fixture fidelity of /metrics and /server_info, the
boot log's clamp, retraction warnings, restart, the 0.5.10 profile, --api-key and the fault hooks."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from advisor.model.pools import GIB, split_pools
from advisor.sim.clock import ManualClock
from advisor.sim.config import SchedulerServerConfig, load_server_config
from advisor.sim.emulator import EmulatedServer
from advisor.sim.exposition import OBSERVED_ONLY_FAMILIES
from advisor.sim.workload import Workload, workload_from_dict
from advisor.sources.server_info import parse_server_info

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEED = 400.0

CHAT = {
    "name": "chat",
    "classes": [{"name": "chat", "input": {"median": 1500, "sigma": 0.8}, "output": {"median": 250, "sigma": 0.6},
                 "max_new_tokens": {"fixed": 4096}, "prefix": {"groups": 4, "tokens": 400}}],  # fmt: skip
    "arrival": {"process": "poisson", "rate": 6},
}
# High-variance outputs against a small KV pool: the admission ratio over-commits and decode retracts.
LONG_OUTPUTS = {
    "name": "long-outputs",
    "classes": [{"name": "gen", "input": {"median": 2000, "sigma": 0.8}, "output": {"median": 4000, "sigma": 1.2},
                 "max_new_tokens": {"fixed": 16384}}],  # fmt: skip
    "arrival": {"process": "poisson", "rate": 4},
}


def workload(spec: dict) -> Workload:
    return workload_from_dict(spec)


def shaped(name: str, **serving: object) -> SchedulerServerConfig:
    """A shipped config with other flags; radix prefix reuse on, so cached-token series exist."""
    config = load_server_config(name)
    return dataclasses.replace(
        config, serving=dataclasses.replace(config.serving, **serving), enable_radix_prefix_reuse=True
    )


def emulated(*args: object, **kwargs: object) -> EmulatedServer:
    """An emulated server on its own ManualClock: the simulation moves only when `step_until` steps it."""
    clock = ManualClock()
    server = EmulatedServer(*args, clock=clock, **kwargs)  # type: ignore[arg-type]
    CLOCKS[id(server)] = clock
    return server


CLOCKS: dict[int, ManualClock] = {}


def step_until(emu: EmulatedServer, predicate: Callable[[], bool], step_seconds: float = 0.05, limit: int = 20_000) -> None:
    """Advance the emulator's clock `step_seconds` at a time (times its speed in simulated seconds) until
    `predicate` holds; deterministic, no sleeping. Fails after `limit` steps."""
    clock = CLOCKS[id(emu)]
    for _ in range(limit):
        if predicate():
            return
        clock.advance(step_seconds)
        emu.sync()
    raise AssertionError(f"condition not reached in {limit * step_seconds:g} clock seconds")


def state(emu: EmulatedServer, **kw: str) -> dict:
    return requests.get(emu.url + "/_emulator/state", timeout=5, **kw).json()  # type: ignore[arg-type]


def families(text: str) -> dict[str, tuple[str, frozenset[frozenset[str]]]]:
    return {
        fam.name: (fam.type, frozenset(frozenset(s.labels) for s in fam.samples))
        for fam in text_string_to_metric_families(text)
    }


def values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted((k, v) for k, v in s.labels.items() if k in ("dp_rank", "tp_rank")))] = s.value
    return out


@pytest.mark.parametrize("fixture,tp,dp", [("single", 1, 1), ("tp2", 2, 1), ("dp2tp4", 4, 2)])
def test_metrics_match_the_genuine_fixture_shape(fixture, tp, dp):
    with emulated(shaped("default", tp_size=tp, dp_size=dp), workload(CHAT), speed=SPEED) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 20)
        body = requests.get(emu.url + "/metrics", timeout=5)
    assert body.status_code == 200 and body.headers["content-type"].startswith("text/plain; version=0.0.4")
    want = families((FIXTURES / "metrics" / f"sglang-0.5.23-{fixture}.prom").read_text())
    got = families(body.text)
    assert set(want) - set(got) == set()
    assert set(got) - set(want) <= OBSERVED_ONLY_FAMILIES  # e.g. queue_time_seconds once requests ran
    for name, shape in want.items():
        assert got[name] == shape, name
    # periodic gauges once per DP rank (its TP0), retraction counters on every rank
    assert sorted(values(body.text, "sglang:num_running_reqs")) == sorted(
        tuple(sorted([("tp_rank", "0")] + ([("dp_rank", str(d))] if dp > 1 else []))) for d in range(dp)
    )
    assert len(values(body.text, "sglang:num_retracted_requests_total")) == tp * dp


# ServerArgs fields the composed /server_info fixtures leave out, which the emulator shows (the advisor reads them)
ADMISSION_KNOBS = frozenset({"max_prefill_tokens", "schedule_policy", "schedule_conservativeness"})


def test_server_info_model_info_loads_and_health_bodies():
    config = shaped("default", tp_size=2, dp_size=2)
    split = config.split()
    with emulated(config, workload(CHAT), speed=SPEED, log_path=None) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 5)
        info = requests.get(emu.url + "/server_info", timeout=5).json()
        old = requests.get(emu.url + "/get_server_info", timeout=5).json()
        model = requests.get(emu.url + "/model_info", timeout=5).json()
        loads = requests.get(emu.url + "/v1/loads", timeout=5).json()
        core = requests.get(emu.url + "/v1/loads?include=core&dp_rank=1", timeout=5).json()
        prom = requests.get(emu.url + "/v1/loads?format=prometheus", timeout=5).text
        bad = requests.get(emu.url + "/v1/loads?include=nonsense", timeout=5)
        health = requests.get(emu.url + "/health", timeout=5)
        missing = requests.get(emu.url + "/get_load", timeout=5)
    fixture = json.loads((FIXTURES / "server_info" / "server_info-tp8-default.json").read_text())
    # the fixture's fields (the DP controller's handshake has no status), and the admission knobs it leaves out
    assert set(info) == set(fixture) - {"status"} | ADMISSION_KNOBS
    assert (info["max_prefill_tokens"], info["schedule_conservativeness"]) == (config.max_prefill_tokens, 1.0)
    assert set(info["internal_states"][0]) == set(fixture["internal_states"][0]) | ADMISSION_KNOBS
    assert set(info["internal_states"][0]["memory_usage"]) == set(fixture["internal_states"][0]["memory_usage"])
    assert len(info["internal_states"]) == 2
    for shard in info["internal_states"]:
        assert shard["max_mamba_cache_size"] == split.max_mamba_cache_size
        assert shard["effective_max_running_requests_per_dp"] == split.max_running_requests
        assert shard["memory_usage"]["token_capacity"] == split.kv_capacity_tokens
        assert shard["memory_usage"]["kvcache"] == pytest.approx(15.03, abs=0.01)
    assert info["max_mamba_cache_size"] is None and info["mamba_radix_cache_strategy"] == "extra_buffer"
    assert info["version"] == "0.5.23" and old.keys() == info.keys()
    assert set(model) >= {"model_path", "served_model_name", "is_generation", "model_type", "architectures"}
    assert [entry["dp_rank"] for entry in loads["loads"]] == [0, 1]
    assert loads["loads"][0]["max_running_requests"] == split.max_running_requests
    assert loads["loads"][0]["max_total_num_tokens"] == split.kv_capacity_tokens
    assert {"memory", "queues", "disaggregation"} <= set(loads["loads"][0])
    assert [e["dp_rank"] for e in core["loads"]] == [1] and "memory" not in core["loads"][0]
    assert f'sglang_max_running_requests{{dp_rank="1"}} {split.max_running_requests}' in prom
    assert 'sglang_memory_token_capacity{dp_rank="0"}' in prom
    assert bad.status_code == 400
    assert health.status_code == 200 and health.content == b""
    assert missing.status_code == 404  # 0.5.23 has only /v1/loads


def test_single_gpu_server_info_matches_its_fixture_keys_and_reports_ready():
    # an operator's own admission knobs: ServerArgs shows them in /server_info, where the advisor's replay reads them
    config = dataclasses.replace(load_server_config("single-qwen3next"), schedule_conservativeness=1.3,
                                 max_prefill_tokens=32768)
    with emulated(config, workload(CHAT), speed=SPEED) as emu:
        info = requests.get(emu.url + "/server_info", timeout=5).json()
    fixture = json.loads((FIXTURES / "server_info" / "server_info-single-kvbound.json").read_text())
    assert set(info) == set(fixture) | ADMISSION_KNOBS and info["status"] == "ready"
    shown = parse_server_info(info)
    assert (shown.schedule_conservativeness, shown.max_prefill_tokens) == (1.3, 32768)
    assert set(info["internal_states"][0]) == set(fixture["internal_states"][0]) | ADMISSION_KNOBS
    shard = info["internal_states"][0]
    assert (shard["max_mamba_cache_size"], shard["effective_max_running_requests_per_dp"]) == (
        fixture["internal_states"][0]["max_mamba_cache_size"],
        fixture["internal_states"][0]["effective_max_running_requests_per_dp"],
    )
    assert shard["memory_usage"]["token_capacity"] == fixture["internal_states"][0]["memory_usage"]["token_capacity"]


MAMBA = re.compile(r"\] Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, ssm_state size: ([\d.]+)GB $")
KV = re.compile(r"\] KV Cache is allocated\. dtype: [\w.]+, #tokens: (\d+), (?:KV size: ([\d.]+) GB|K size: ([\d.]+) GB, V size: ([\d.]+) GB)$")
CAPS = re.compile(r"\] max_total_num_tokens=(\d+), chunked_prefill_size=\d+, max_prefill_tokens=\d+, max_running_requests=(\d+), context_len=\d+, available_gpu_mem=[\d.]+ GB$")
CAPPED = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache \(max_mamba_cache_size=(\d+), (\d+) state slots per request\)")


@pytest.mark.parametrize("name", ["default", "single-qwen3next", "lazy"])
def test_boot_log_states_the_clamp_the_dual_pool_model_predicts(tmp_path, name):
    config = load_server_config(name)
    log = tmp_path / "sglang.log"
    with emulated(config, workload(CHAT), speed=SPEED, log_path=str(log)):
        pass
    text = log.read_text()
    lines = text.splitlines()
    expected = split_pools(config.rest_bytes, config.serving, config.constants, model_context_len=config.model_context_len)
    mamba = [MAMBA.search(x) for x in lines if "Mamba Cache" in x]
    kv = [KV.search(x) for x in lines if "KV Cache" in x]
    caps = [CAPS.search(x) for x in lines if "max_total_num_tokens=" in x]
    assert len(mamba) == len(kv) == config.serving.tp_size and all(mamba) and all(kv)
    assert len(caps) == 1 and caps[0] is not None
    assert int(mamba[0].group(1)) == expected.max_mamba_cache_size
    state_gib = float(mamba[0].group(2)) + float(mamba[0].group(3))
    assert state_gib == pytest.approx((expected.max_mamba_cache_size + 1) * config.constants.state_bytes_per_slot / GIB, abs=0.011)
    assert int(kv[0].group(1)) == expected.kv_capacity_tokens
    kv_gib = float(kv[0].group(2)) if kv[0].group(2) else float(kv[0].group(3)) + float(kv[0].group(4))
    assert kv_gib == pytest.approx(expected.kv_capacity_tokens * config.constants.kv_bytes_per_token / GIB, abs=0.011)
    assert (int(caps[0].group(1)), int(caps[0].group(2))) == (expected.kv_capacity_tokens, expected.max_running_requests)
    capped = [CAPPED.search(x) for x in lines if "is capped to" in x]
    assert bool(capped) == expected.clamped_by_state_pool
    if capped:
        assert capped[0] is not None and int(capped[0].group(1)) == expected.max_running_requests
    assert lines[-1].endswith("The server is fired up and ready to roll!") or "ready to roll" in text


def test_retraction_warnings_on_every_tp_rank_only_when_the_kv_pool_binds(tmp_path):
    kv_log, state_log = tmp_path / "kv.log", tmp_path / "state.log"
    kv_bound = shaped("single-qwen3next", tp_size=2)
    with emulated(kv_bound, workload(LONG_OUTPUTS), speed=1000.0, log_path=str(kv_log)) as emu:
        step_until(emu, lambda: state(emu)["workers"][0]["retracted_requests_total"] >= 3)
        metrics = requests.get(emu.url + "/metrics", timeout=5).text
    retracted = emu.state(advance=False)["workers"][0]["retracted_requests_total"]  # as of the last log write
    warnings = [x for x in kv_log.read_text().splitlines() if "KV cache pool is full. Retract requests." in x]
    by_rank = {rank: [w.split("] ", 1)[1] for w in warnings if f" {rank}]" in w] for rank in ("TP0", "TP1")}
    assert by_rank["TP0"] and by_rank["TP0"] == by_rank["TP1"]
    assert all("#new_tokens_gained: " in w and "#mamba_num_gained: " in w for w in warnings)
    logged = sum(int(re.search(r"#retracted_reqs: (\d+)", w).group(1)) for w in by_rank["TP0"])
    counters = values(metrics, "sglang:num_retracted_requests_total")
    assert set(counters.values()) == {counters[(("tp_rank", "0"),)]}  # repeated on every TP rank
    assert counters[(("tp_rank", "0"),)] <= logged == retracted

    state_bound = load_server_config("default")  # clamp 51 by the state pool, KV to spare
    with emulated(state_bound, workload(LONG_OUTPUTS), speed=1000.0, log_path=str(state_log)) as emu:
        step_until(emu, lambda: state(emu)["workers"][0]["running_requests"] >= state_bound.split().max_running_requests - 2)
        step_until(emu, lambda: state(emu)["requests_finished"] >= 20)
        metrics = requests.get(emu.url + "/metrics", timeout=5).text
    assert "Retract requests" not in state_log.read_text()
    assert set(values(metrics, "sglang:num_retracted_requests_total").values()) == {0.0}


def test_queue_time_is_observed_once_a_request_as_its_first_forward_begins():
    """As SGLang 0.5.23 (observability/req_time_stats.py set_forward_entry_time): sglang:queue_time_seconds holds
    one observation a request, its wait before its first forward, taken when that forward begins: the requests
    still running count in it beside those finished, and a server whose state pool queues them shows waits."""
    config = load_server_config("default")  # clamp 51 by the state pool
    with emulated(config, workload(LONG_OUTPUTS), speed=1000.0) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 60 and state(emu)["workers"][0]["queued_requests"] > 0)
        now = state(emu)
        metrics = requests.get(emu.url + "/metrics", timeout=5).text
    counts = values(metrics, "sglang:queue_time_seconds_count")
    assert set(counts.values()) == {counts[(("tp_rank", "0"),)]}  # every TP rank observes it alike
    running = now["workers"][0]["running_requests"]
    assert running > 0 and counts[(("tp_rank", "0"),)] == now["requests_finished"] + running
    waits = values(metrics, "sglang:queue_time_seconds_sum")
    assert waits[(("tp_rank", "0"),)] > 0.0


def test_restart_resets_counters_and_writes_a_new_boot(tmp_path):
    log = tmp_path / "sglang.log"
    config = load_server_config("default")
    with emulated(config, workload(CHAT), speed=SPEED, log_path=str(log)) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 30)
        before = state(emu)
        reply = requests.post(emu.url + "/_emulator/restart?ratio=2.0", timeout=5)
        after = reply.json()
        info = requests.get(emu.url + "/server_info", timeout=5).json()
        metrics_after = requests.get(emu.url + "/metrics", timeout=5).text
        emu.restart(max_mamba_cache_size=400)
        pinned = state(emu)
        bad = requests.post(emu.url + "/_emulator/restart?ratio=-1", timeout=5)
    assert reply.status_code == 200 and bad.status_code == 400
    assert (before["boot_count"], after["boot_count"], pinned["boot_count"]) == (1, 2, 3)
    assert after["requests_finished"] < before["requests_finished"]
    assert after["sim_time"] < before["sim_time"]
    expected = config.with_ratio(2.0).split()
    assert after["split"]["max_mamba_cache_size"] == expected.max_mamba_cache_size != before["split"]["max_mamba_cache_size"]
    assert info["mamba_full_memory_ratio"] == 2.0
    assert info["internal_states"][0]["max_mamba_cache_size"] == expected.max_mamba_cache_size
    assert values(metrics_after, "sglang:max_total_num_tokens")[(("tp_rank", "0"),)] == expected.kv_capacity_tokens
    assert pinned["max_mamba_cache_size_flag"] == 400 and pinned["split"]["max_mamba_cache_size"] == 400
    text = log.read_text()
    assert text.count("] server_args={") == 3  # 0.5.20+ logs the resolved dict
    assert text.count("The server is fired up and ready to roll!") == 3
    assert f"max_mamba_cache_size: {expected.max_mamba_cache_size}," in text


def test_version_profile_0510(tmp_path):
    log = tmp_path / "old.log"
    with emulated(
        shaped("single-qwen3next"), workload(LONG_OUTPUTS), speed=1000.0, log_path=str(log), version_profile="0.5.10"
    ) as emu:
        step_until(emu, lambda: state(emu)["workers"][0]["retracted_requests_total"] >= 1)
        metrics = requests.get(emu.url + "/metrics", timeout=5).text
        info = requests.get(emu.url + "/server_info", timeout=5).json()
        get_load = requests.get(emu.url + "/get_load", timeout=5)
        loads = requests.get(emu.url + "/v1/loads", timeout=5)
    fams = families(metrics)
    assert "sglang:mamba_used_tokens" not in fams and "sglang:kv_used_tokens" not in fams
    assert "sglang:page_size" not in fams and "sglang:kv_cache_memory_usage_gb" not in fams
    assert "sglang:prompt_tokens_histogram" not in fams  # needs --collect-tokens-histogram in 0.5.10
    assert fams["sglang:num_requests"][1] == {frozenset({"model_name"})}  # no engine_type tokenizer label
    assert "sglang:mamba_usage" in fams and "sglang:num_retracted_requests" in fams
    assert "mamba_scheduler_strategy" in info and "mamba_radix_cache_strategy" not in info
    assert info["version"] == "0.5.10"
    assert get_load.status_code == 200 and set(get_load.json()[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    assert loads.status_code == 200
    with emulated(
        shaped("default"), workload(CHAT), speed=SPEED, version_profile="0.5.10", collect_tokens_histogram=True
    ) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 1)
        histograms = families(requests.get(emu.url + "/metrics", timeout=5).text)
    assert "sglang:prompt_tokens_histogram" in histograms and "sglang:uncached_prompt_tokens_histogram" not in histograms
    warning = next(x for x in log.read_text().splitlines() if "Retract requests" in x)
    assert "#new_tokens_gained" in warning and "#mamba_num_gained" not in warning


def test_api_key_guards_everything_but_health_ready_and_metrics():
    with emulated(load_server_config("default"), workload(CHAT), speed=SPEED, api_key="s3cret") as emu:
        url = emu.url
        good = {"Authorization": "Bearer s3cret"}
        assert requests.get(url + "/server_info", timeout=5).status_code == 401
        assert requests.get(url + "/server_info", headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
        denied = requests.get(url + "/v1/loads", timeout=5)
        assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
        assert requests.get(url + "/server_info", headers=good, timeout=5).json()["api_key"] == "s3cret"
        assert requests.get(url + "/_emulator/state", timeout=5).status_code == 401
        assert requests.get(url + "/_emulator/state", headers=good, timeout=5).status_code == 200
        for open_path in ("/health", "/health_generate", "/ready", "/metrics"):
            assert requests.get(url + open_path, timeout=5).status_code == 200, open_path


def test_fault_modes(tmp_path):
    with emulated(load_server_config("default"), workload(CHAT), speed=SPEED) as emu:
        def fault(mode: str) -> int:
            return requests.post(emu.url + f"/_emulator/fault?mode={mode}", timeout=5).status_code

        assert fault("bogus") == 400
        assert fault("http500") == 200
        assert requests.get(emu.url + "/metrics", timeout=5).status_code == 500
        assert requests.get(emu.url + "/server_info", timeout=5).status_code == 500
        assert fault("garbage") == 200
        garbage = requests.get(emu.url + "/metrics", timeout=5)
        assert garbage.status_code == 200 and b"sglang:" not in garbage.content
        assert fault("truncate") == 200
        cut = requests.get(emu.url + "/metrics", timeout=5).text
        assert cut.startswith("# HELP") and not cut.endswith("\n")
        last = cut.rsplit("\n", 1)[1]
        assert last.startswith("sglang:") and "{" in last and "}" not in last  # cut inside a sample's labels
        with pytest.raises(ValueError):
            list(text_string_to_metric_families(cut))
        with pytest.raises(json.JSONDecodeError):
            json.loads(requests.get(emu.url + "/server_info", timeout=5).text)
        assert fault("hang") == 200
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.get(emu.url + "/metrics", timeout=0.3)
        assert fault("none") == 200
        assert requests.get(emu.url + "/metrics", timeout=5).status_code == 200
        assert fault("hang") == 200
        try:
            requests.get(emu.url + "/health", timeout=0.2)
        except requests.exceptions.ReadTimeout:
            pass
    # stop() released the hung handler: a fresh server on the same thread works at once
    with emulated(load_server_config("default"), workload(CHAT), speed=SPEED) as emu:
        assert requests.get(emu.url + "/health", timeout=5).status_code == 200


def test_request_log_lines_are_sglang_json_records(tmp_path):
    requests_log = tmp_path / "requests.log"
    with emulated(load_server_config("default"), workload(CHAT), speed=SPEED, request_log_path=str(requests_log)) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 10)
    records = [json.loads(x.split("] ", 1)[1]) for x in requests_log.read_text().splitlines()]
    assert len(records) >= 10
    assert {r["event"] for r in records} == {"request.finished"}
    meta = records[0]["out"]["meta_info"]
    assert {"prompt_tokens", "completion_tokens", "cached_tokens", "num_retractions", "e2e_latency"} <= set(meta)
    assert all("sampling_params" not in r["obj"] for r in records)  # level 0: none shown
    # the chat outputs (median 250) stop on their own long before their 4096 cap
    assert {r["out"]["meta_info"]["finish_reason"]["type"] for r in records} == {"stop"}


def test_at_sglangs_default_request_log_level_each_line_shows_its_clients_max_new_tokens(tmp_path):
    requests_log = tmp_path / "requests.log"
    half_unset = {**CHAT, "classes": [{**CHAT["classes"][0], "max_new_tokens": {"fixed": 4096, "unset_fraction": 0.5}}]}
    with emulated(load_server_config("default"), workload(half_unset), speed=SPEED, request_log_path=str(requests_log),
                  log_requests_level=2) as emu:
        step_until(emu, lambda: state(emu)["requests_finished"] >= 40)
    records = [json.loads(x.split("] ", 1)[1]) for x in requests_log.read_text().splitlines()]
    shown = [r["obj"]["sampling_params"]["max_new_tokens"] for r in records]
    assert len(shown) >= 40 and set(shown) == {4096, None}


def test_cli_emulate_serves_until_sigterm(tmp_path):
    spec = tmp_path / "chat.yaml"
    spec.write_text(yaml.safe_dump(CHAT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "advisor", "emulate", "--port", "0", "--workload", str(spec), "--speed", "50",
         "--log-file", str(tmp_path / "cli.log")],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+)", first)
        assert url, first
        assert requests.get(url.group(1) + "/health", timeout=5).status_code == 200
        assert "sglang:num_running_reqs" in requests.get(url.group(1) + "/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    assert code == 0
    assert "ready to roll" in (tmp_path / "cli.log").read_text()


def test_cli_rejects_bad_flags():
    bad = subprocess.run(
        [sys.executable, "-m", "advisor", "emulate", "--speed", "0"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "--speed must be > 0" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_speculative_decoding_shows_in_boot_log_decode_lines_gauges_and_loads(tmp_path):
    log = tmp_path / "spec.log"
    config = load_server_config("spec")
    split = config.split()
    with emulated(config, workload(CHAT), speed=SPEED, log_path=str(log)) as emu:
        step_until(emu, lambda: "Decode batch" in log.read_text())
        metrics = requests.get(emu.url + "/metrics", timeout=5).text
        loads = requests.get(emu.url + "/v1/loads", timeout=5).json()
        info = requests.get(emu.url + "/server_info", timeout=5).json()
    text = log.read_text()
    assert "Max running requests is reset to 48 for speculative decoding." in text
    assert "intermediate_ssm_state_cache size: " in text and "intermediate_conv_window_cache size: " in text
    decode = next(x for x in text.splitlines() if "Decode batch" in x)
    assert re.search(r"mamba usage: [\d.]+, accept len: [\d.]+, accept rate: [\d.]+, cuda graph: True", decode)
    length = values(metrics, "sglang:spec_accept_length")[(("tp_rank", "0"),)]
    assert length == config.cost.spec_accept_length
    assert loads["loads"][0]["speculative"]["accept_length"] == length
    assert info["max_running_requests"] == 48 and info["speculative_num_draft_tokens"] == config.serving.draft_tokens
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == split.max_running_requests


def test_server_info_reports_logical_tokens_under_dcp_and_the_reader_recovers_physical_rows():
    from advisor.sources.server_info import parse_server_info

    config = load_server_config("dcp8")
    with emulated(config, workload(CHAT), speed=SPEED) as emu:
        body = requests.get(emu.url + "/server_info", timeout=5).json()
    rows = config.split().kv_capacity_tokens
    assert config.serving.dcp_size == 8
    assert body["internal_states"][0]["memory_usage"]["token_capacity"] == rows * 8
    assert parse_server_info(body).shards[0].kv_capacity_physical_tokens == rows


def test_stop_closes_keep_alive_connections():
    """A client holding a keep-alive connection (as Prometheus does) sees a stopped server go away."""
    session = requests.Session()
    emu = emulated(load_server_config("default"), workload(CHAT), speed=SPEED).start()
    url = emu.url
    assert session.get(url + "/health", timeout=5).status_code == 200  # the connection stays open
    emu.stop()
    with pytest.raises(requests.exceptions.ConnectionError):
        session.get(url + "/health", timeout=5)
