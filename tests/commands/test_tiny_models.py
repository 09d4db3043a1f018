"""A small hybrid model: SGLang 0.5.23 prints its state pool as `conv_state size: 0.00GB, ssm_state size: 0.00GB`
(mem_cache/memory_pool.py MambaPool ~996-1009 formats GB with two decimals). The constants come from what else
is there (the ratio, the model config), and when nothing gives them `inspect` still shows the rest and names what
is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import FIXTURES

from advisor.model.state_shapes import model_bytes
from advisor.sources.bootlog import parse_boot_log

# A tiny Qwen3-Next-shaped GDN model: 8 layers (2 full attention), 4 value heads of 64: 47 KB of state per slot.
TINY_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 8, "full_attention_interval": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "hidden_size": 256,
}


def tiny_log(args: str) -> str:
    return "\n".join([
        f"[2026-11-30 10:00:00] server_args={{'tp_size': 1, {args}}}",
        "[2026-11-30 10:00:01] Load weight end. elapsed=1.00 s, type=Qwen3NextForCausalLM, avail mem=77.00 GB, mem usage=0.10 GB.",
        "[2026-11-30 10:00:02] Mamba Cache is allocated. max_mamba_cache_size: 64, conv_state size: 0.00GB, ssm_state size: 0.00GB ",
        "[2026-11-30 10:00:02] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 8000000, KV size: 3.81 GB",
        "[2026-11-30 10:00:03] max_total_num_tokens=8000000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=12, context_len=32768, available_gpu_mem=60.00 GB",
    ]) + "\n"


PINNED = tiny_log("'max_mamba_cache_size': 64, 'mamba_full_memory_ratio': 0.9")


def run(*args):
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, timeout=60)


def test_the_ratio_cannot_give_a_pinned_pools_slot_so_the_log_names_what_is_missing():
    pools = parse_boot_log(PINNED).pools()
    assert pools.constants is None and "state bytes per slot" in pools.missing


def test_recommend_takes_the_slot_from_the_model_config_and_says_so(tmp_path):
    log = tmp_path / "tiny.log"
    log.write_text(PINNED)
    refused = run("recommend", "--boot-log", str(log), "--context-length", "4096", "--json")
    assert refused.returncode == 2 and "state bytes per slot" in refused.stderr and "--model-config" not in refused.stdout
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    done = run("recommend", "--boot-log", str(log), "--model-config", str(config), "--context-length", "4096", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    derived = model_bytes(TINY_CONFIG)
    # the slot from the model config, the KV row from the boot log's pool
    assert out["token_equiv"] == pytest.approx(derived.state_bytes_per_slot / (3.81 * 2**30 / 8_000_001), rel=0.01)
    assert any("0.00 GB" in note for note in out["notes"])


def test_inspect_shows_the_rest_and_names_what_is_missing(tmp_path):
    log = tmp_path / "tiny.log"
    log.write_text(PINNED)
    proc = run("inspect", "--log-file", str(log), "--metrics-file",
               str(FIXTURES / "metrics" / "sglang-0.5.23-single.prom"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    boot = out["config"]["boot_log"]
    assert (boot["max_mamba_cache_size"], boot["kv_capacity_tokens"], boot["max_running_requests"]) == (64, 8000000, 12)
    assert boot["state_bytes_per_slot"] is None and "state bytes per slot" in boot["missing"]
    assert out["ranks"] and out["model"]["token_equiv"] is None


def test_a_ratio_sized_tiny_pool_is_solved_from_the_ratio():
    # unpinned, the slot count came from the ratio: the joint solve gives the slot back from K and the KV pool
    # (kv_cache_configurator.py ~3380-3386), the 0.00 GB line notwithstanding
    text = tiny_log("'mamba_full_memory_ratio': 0.0005")
    pools = parse_boot_log(text).pools()
    assert pools.state_from == "ratio" and pools.constants is not None
    assert pools.constants.state_bytes_per_slot == pytest.approx(0.0005 / 1.0005 * 3.81 * 2**30 / 65.5, rel=0.02)


def test_mtp_without_nextn_layers_charges_no_draft_kv(tmp_path):
    # spec_aux_hidden_state.py ~170-178: a path-less MTP deployment whose config has no num_nextn_predict_layers
    # gets no draft KV; an EAGLE draft model has its own layer (one), and an explicit count wins
    from advisor.commands.recommend import _draft_layers
    from advisor.model.serving import ServingConfig

    assert _draft_layers(TINY_CONFIG, ServingConfig(speculative_algorithm="NEXTN", draft_tokens=3)) == 0
    assert _draft_layers(TINY_CONFIG, ServingConfig(speculative_algorithm="EAGLE", draft_tokens=3)) == 1
    assert _draft_layers({**TINY_CONFIG, "num_nextn_predict_layers": 2}, ServingConfig(speculative_algorithm="NEXTN")) == 2
