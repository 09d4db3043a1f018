"""`pool-advisor recommend` as a user runs it: a real subprocess, JSON keys, exit codes."""

import json
import subprocess
import sys

import pytest
from support import LOGS, TESTS

REQUIRED_KEYS = {
    "ratio", "token_equiv", "slots_per_request", "draft_tokens", "dcp_size", "state_bytes_per_slot",
    "kv_bytes_per_token", "predicted_max_running_requests", "kv_capacity_requests", "binding_pool",
    "pin_max_mamba_cache_size", "notes",
}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "advisor", "recommend", *args], capture_output=True, text=True, timeout=60)


def test_issue_example_prints_ratio_1_8():
    proc = run_cli("--boot-log", str(LOGS / "boot-tp8-default.log"), "--context-length", "9216", "--strategy", "extra_buffer_lazy", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert REQUIRED_KEYS <= out.keys()
    assert out["ratio"] == pytest.approx(1.8, abs=0.05)
    assert out["slots_per_request"] == 4
    assert out["binding_pool"] == "balanced"
    assert out["live"]["predicted_max_running_requests"] == out["live"]["logged_max_running_requests"] == 51


def test_human_report_ends_in_flag_line():
    proc = run_cli("--state-bytes-per-slot", "56.4e6", "--kv-bytes-per-token", "13.8e3", "-L", "9216", "--strategy", "extra_buffer_lazy")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "--mamba-full-memory-ratio 1.77"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-L", "9216"], "need the byte constants"),
        (["--state-bytes-per-slot", "1e6", "-L", "9216"], "go together"),
        (["--boot-log", "/nonexistent/boot.log", "-L", "9216"], "cannot read boot log"),
        (["--state-bytes-per-slot", "1e6", "--kv-bytes-per-token", "1e3", "-L", "0"], "context-length"),
        (["--state-bytes-per-slot", "1e6", "--kv-bytes-per-token", "1e3", "-L", "9216", "--strategy", "lazy"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_garbled_boot_log(tmp_path):
    garbled = tmp_path / "garbled.log"
    garbled.write_bytes(b"\x00\xff garbage\n[2026-11-29 10:00:46 TP0] KV Cache is allocated. dtype: torch.bf16, #tok")
    proc = run_cli("--boot-log", str(garbled), "-L", "9216")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1


QWEN3_NEXT = TESTS / "model" / "data" / "hf_configs" / "Qwen3-Next-80B-A3B-Instruct.json"


def _json(*args):
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_model_config_under_dcp_prices_kv_heads_per_rank():
    # Qwen3-Next has 2 KV heads: at TP8 each rank holds max(1, 2 // 8) = 1 head; under DCP 8 the heads are split
    # over tp // dcp = 1 rank, so each holds both: twice the bytes per physical row, a DCP gain of 4, not 8
    base = ["--model-config", str(QWEN3_NEXT), "--tp-size", "8", "-L", "9216", "--strategy", "extra_buffer_lazy"]
    plain = _json(*base)
    dcp = _json(*base, "--dcp-size", "8")
    assert dcp["kv_bytes_per_token"] == pytest.approx(2 * plain["kv_bytes_per_token"])
    assert dcp["ratio"] == pytest.approx(plain["ratio"] * 8 / 2)


def test_model_config_under_spec_prices_the_draft_kv_in_the_cell():
    base = ["--model-config", str(QWEN3_NEXT), "--tp-size", "8", "-L", "9216", "--strategy", "extra_buffer_lazy"]
    plain = _json(*base)
    spec = _json(*base, "--draft-tokens", "4")
    assert spec["kv_bytes_per_token"] == pytest.approx(plain["kv_bytes_per_token"])
    assert not any("draft model's KV is unknown" in note for note in spec["notes"])


def test_a_given_decode_lock_skip_is_not_called_assumed():
    base = ["--boot-log", str(LOGS / "boot-tp8-default.log"), "-L", "9216", "--strategy", "extra_buffer_lazy"]
    assumed = _json(*base)
    told = _json(*base, "--skip-decode-lock")
    assert told["slots_per_request"] == assumed["slots_per_request"] - 1
    assert any("assumed off" in note for note in assumed["notes"])
    assert not any("assumed" in note for note in told["notes"])
