"""`pool-advisor inspect` on every genuine fixture, checked against the `*.truth.json` that made it."""

import json
import subprocess
import sys

import pytest
from support import FIXTURES, wait_for


def inspect(*args):
    proc = subprocess.run([sys.executable, "-m", "advisor", "inspect", *args, "--json"], capture_output=True, text=True, timeout=60)
    return proc


@pytest.mark.parametrize("shape", ["single", "tp2", "dp2tp4"])
def test_metrics_fixture_matches_truth(shape):
    truth = json.loads((FIXTURES / "metrics" / f"sglang-0.5.23-{shape}.truth.json").read_text())
    proc = inspect("--metrics-file", str(FIXTURES / "metrics" / f"sglang-0.5.23-{shape}.prom"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["errors"] == []
    assert len(out["ranks"]) == len(truth["ranks"])
    for got, want in zip(out["ranks"], truth["ranks"], strict=True):
        assert got["dp_rank"] == want["dp_rank"]
        assert got["running_requests"] == want["running"]
        assert got["queued_requests"] == want["queue"]
        assert got["retracted_requests_total"] == want["retracted_reqs_total"]
        assert got["kv_capacity_tokens"] == want["kv_tokens"]
        assert got["state_pool_slots"] == want["mamba_size"]
        assert got["state_slots_used"] == want["mamba_used"]
        assert got["kv_used_tokens"] == want["kv_used"]
        assert got["live_context_mean"] == pytest.approx(want["sum_seq"] / want["running"])
    requests = truth["requests"]
    assert out["requests_total"] == requests["count"]
    assert out["context_length"]["mean"] == pytest.approx(requests["mean_context"], rel=1e-6)
    assert out["context_length"]["p50"] <= out["context_length"]["p90"] <= out["context_length"]["p99"]
    assert out["config"] is None


def test_logs_and_server_info():
    proc = inspect(
        "--log-file", str(FIXTURES / "logs" / "runtime-kvbound-single.log"),
        "--log-file", str(FIXTURES / "logs" / "requests-json.log"),
        "--server-info-file", str(FIXTURES / "server_info" / "server_info-single-kvbound.json"),
    )
    out = json.loads(proc.stdout)
    assert out["context_length"]["source"] == "request_logs"
    assert out["context_length"]["requests"] == out["requests_total"] > 0
    assert out["config"]["serving"]["strategy"] == "extra_buffer_lazy"
    assert out["config"]["boot_log"]["max_running_requests"] == 138
    assert out["log_retractions"] > 0
    # the feeder's view: constants from the boot log, the clamp /server_info reports
    assert out["model"]["token_equiv"] == pytest.approx(out["config"]["boot_log"]["token_equiv"])
    assert out["model"]["observed_max_running_requests"] == out["config"]["shards"][0]["effective_max_running_requests"]


def test_boot_log_alone_gives_the_serving_config_and_constants():
    proc = inspect("--log-file", str(FIXTURES / "logs" / "boot-tp8-default.log"))
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out["errors"]
    assert out["model"]["strategy"] == "auto" and out["model"]["mamba_full_memory_ratio"] == pytest.approx(0.9)
    assert out["model"]["token_equiv"] == pytest.approx(4065, abs=1)
    assert out["model"]["observed_max_running_requests"] == 51


def test_nothing_to_inspect_and_cut_exposition(tmp_path):
    proc = inspect()
    assert proc.returncode == 2 and "nothing to inspect" in proc.stderr
    cut = tmp_path / "cut.prom"
    cut.write_text((FIXTURES / "metrics" / "sglang-0.5.23-tp2.prom").read_text()[:30001])
    proc = inspect("--metrics-file", str(cut))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_unreachable_url_reports_errors():
    proc = inspect("--url", "http://127.0.0.1:9", "--timeout", "1")
    out = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert any(e.startswith("metrics:") for e in out["errors"])


def test_inspect_a_live_emulated_server(tmp_path):
    from advisor.sim.config import load_server_config
    from advisor.sim.emulator import EmulatedServer
    from advisor.sim.workload import load_workload

    log_path = tmp_path / "sglang.log"
    server = EmulatedServer(load_server_config("default"), load_workload("demo"), speed=200, log_path=str(log_path),
                            request_log_path=str(log_path))
    server.start()
    try:
        # the boot block is written at start; wait for the first finished request's log line
        wait_for(lambda: log_path.exists() and '"prompt_tokens"' in log_path.read_text(), 30,
                 what="a finished request in the emulator's log")
        proc = inspect("--url", server.url, "--log-file", str(log_path))
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["errors"] == []
    rank = out["ranks"][0]
    assert rank["state_pool_slots"] == 257 and rank["kv_capacity_tokens"] == 1167552
    assert out["config"]["shards"][0]["effective_max_running_requests"] == 51
    assert out["config"]["boot_log"]["max_running_requests"] == 51
    assert out["context_length"]["source"] == "request_logs" and out["context_length"]["requests"] > 0
