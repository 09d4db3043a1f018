"""State bytes per slot of every hybrid family SGLang 0.5.23 knows, from its own config classes, against the
advisor's `model_bytes`. Outside the test suite (needs SGLang's code):

    ../shared/tools/make-sglang-venv.sh /tmp/sglang-venv
    /tmp/sglang-venv/bin/python tools/sglang_families.py                    # prints the table, exit 1 on a mismatch
    /tmp/sglang-venv/bin/python tools/sglang_families.py --write tests/model/data/family_configs

Each family gets a config.json shaped like its checkpoints' (sizes chosen here, fields as the config class reads
them); SGLang's class (`configs/*.py`, picked as `configs/hybrid_arch.py` does) gives `mamba2_cache_params`
(`mamba_cache_per_req`, the state layers) at attention-TP 1, 2 and 4. `--write` stores the configs and the truth
for `tests/model/test_state_shapes_families.py`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GDN_TEXT = {
    "num_hidden_layers": 8, "full_attention_interval": 4, "hidden_size": 1024, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
    "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "vocab_size": 1000,
    "intermediate_size": 2048, "mamba_ssm_dtype": "bfloat16",
}
NEMOTRON = {
    "hybrid_override_pattern": "M-M*M-M*", "num_hidden_layers": 8, "hidden_size": 1024, "mamba_num_heads": 32,
    "mamba_head_dim": 32, "n_groups": 4, "ssm_state_size": 64, "conv_kernel": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 1000, "intermediate_size": 2048,
}
KDA_LINEAR = {"num_heads": 16, "head_dim": 64, "short_conv_kernel_size": 4}
KIMI_TEXT = {
    "model_type": "kimi_linear", "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
    "num_key_value_heads": 16, "kv_lora_rank": 256, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64,
    "linear_attn_config": {**KDA_LINEAR, "kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8]},
    "vocab_size": 1000, "intermediate_size": 2048,
}
LFM2_TEXT = {
    "model_type": "lfm2", "num_hidden_layers": 8, "hidden_size": 1024, "conv_L_cache": 3, "num_attention_heads": 16,
    "num_key_value_heads": 8, "vocab_size": 1000,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv"],
}
JET_TEXT = {
    "model_type": "jet_nemotron", "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
    "layer_types": ["jet", "attn", "jet", "jet", "swa", "jet"], "num_hidden_layers": 6, "vocab_size": 1000,
    "intermediate_size": 2048, "efficient_attention_config": {"jet": {
        "mode": "chunk", "expand_v": 2.0, "num_heads": 12, "head_dim": 96, "norm_eps": "1e-5", "conv_size": 4,
        "dconv_generator_reduction": 8, "dconv_implementation": "triton"}},
}

# architecture -> (SGLang module, class, config.json, where the mambaish config sits: "" | "text_config" | "llm_config")
FAMILIES: dict[str, tuple[str, str, dict, str]] = {
    "Qwen4ExpForConditionalGeneration": ("qwen4_exp", "Qwen4ExpConfig", {"text_config": {
        **GDN_TEXT, "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention",
                                    "linear_attention", "linear_attention", "qwen_sparse_attention", "linear_attention"]}},
        "text_config"),
    "InternS2PreviewForConditionalGeneration": ("interns2preview", "InternS2PreviewConfig", {"text_config": GDN_TEXT},
                                                "text_config"),
    "InternS2MobiusForConditionalGeneration": ("interns2_mobius", "InternS2MobiusConfig", {"text_config": GDN_TEXT},
                                               "text_config"),
    "MiniCPMV4_6ForConditionalGeneration": ("minicpmv4_6", "MiniCPMV4_6Config",
                                            {"text_config": {**GDN_TEXT, "model_type": "qwen3_5_text"}}, "text_config"),
    "MiniCPMV4_7ForConditionalGeneration": ("minicpmv4_7", "MiniCPMV4_7Config",
                                            {"text_config": {**GDN_TEXT, "model_type": "qwen3_5_moe_text"}}, "text_config"),
    "GigaChat35ForCausalLM": ("gigachat35", "GigaChat35Config", {
        **{k: v for k, v in GDN_TEXT.items() if k != "full_attention_interval"},
        "layer_types": ["linear_attention", "full_attention"] * 4}, ""),
    "JetNemotronForCausalLM": ("jet_nemotron", "JetNemotronConfig", JET_TEXT, ""),
    "JetVLMForConditionalGeneration": ("jet_vlm", "JetVLMConfig", {"text_config": JET_TEXT}, "text_config"),
    "NemotronHPuzzleForCausalLM": ("nemotron_h", "NemotronHPuzzleConfig", {
        **NEMOTRON, "block_configs": [{"block_type": "mamba"}] * 8}, ""),
    "NemotronH_Nano_VL_V2": ("nano_nemotron_vl", "NemotronH_Nano_VL_V2_Config", {"llm_config": NEMOTRON, "vision_config": {}}, "llm_config"),
    "NemotronH_Omni_Reasoning_V3": ("nano_nemotron_vl", "NemotronH_Omni_Reasoning_V3_Config",
                                    {"llm_config": NEMOTRON, "vision_config": {}}, "llm_config"),
    "Mamba2ForCausalLM": ("mamba2", "Mamba2Config", {
        "num_heads": 64, "head_dim": 64, "hidden_size": 2048, "expand": 2, "intermediate_size": 4096, "n_groups": 8, "state_size": 128,
        "conv_kernel": 4, "num_hidden_layers": 8, "vocab_size": 1000}, ""),
    "Lfm2MoeForCausalLM": ("lfm2_moe", "Lfm2MoeConfig", {**LFM2_TEXT, "model_type": "lfm2_moe"}, ""),
    "Lfm2VlForConditionalGeneration": ("lfm2_vl", "Lfm2VlConfig", {"text_config": LFM2_TEXT}, "text_config"),
    "ZayaForCausalLM": ("zaya", "ZayaConfig", {
        "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "cca_time0": 2, "cca_time1": 3, "vocab_size": 1000}, ""),
    "InklingForConditionalGeneration": ("inkling", "InklingMMConfig", {"text_config": {
        "hidden_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
        "head_dim": 128, "swa_num_key_value_heads": 8, "swa_head_dim": 64, "sconv_kernel_size": 4,
        "vocab_size": 1000}}, "text_config"),
    "KimiK3ForConditionalGeneration": ("kimi_k3", "KimiK3Config", {"text_config": KIMI_TEXT}, "text_config"),
    "Glm5NextForConditionalGeneration": ("glm5_next", "Glm5NextConfig", {"text_config": {
        "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 64, "vocab_size": 1000,
        "linear_attn_config": {**KDA_LINEAR, "kda_layers": [0, 1, 2, 4, 5, 6]}}}, "text_config"),
    "BailingMoeV2_5ForCausalLM": ("bailing_hybrid", "BailingHybridConfig", {
        "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 64, "layer_group_size": 4, "use_kda": False, "vocab_size": 1000}, ""),
    "BailingMoeV3ForCausalLM": ("bailing_hybrid", "BailingHybridConfig", {
        "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 64, "layer_group_size": [1, 1, 1, 0, 1, 1, 1, 0], "use_kda": True, "short_conv_kernel_size": 4,
        "vocab_size": 1000}, ""),
}


def _patch_parallel(tp: int) -> None:
    parallel = types.SimpleNamespace(attn_tp_size=tp, tp_size=tp)
    import sglang.srt.runtime_context as runtime_context

    runtime_context.get_parallel = lambda: parallel
    runtime_context.linear_attn_tp_size = lambda: tp
    for name in {module for module, *_ in FAMILIES.values()} | {"qwen3_next", "qwen3_5", "kimi_linear", "lfm2"}:
        module = importlib.import_module(f"sglang.srt.configs.{name}")
        if hasattr(module, "get_parallel"):
            module.get_parallel = lambda: parallel
        if hasattr(module, "linear_attn_tp_size"):
            module.linear_attn_tp_size = lambda: tp
        if hasattr(module, "_is_cpu"):
            module._is_cpu = False
        if hasattr(module, "get_exec"):  # Inkling: --enable-scattered-sconv off (its default)
            module.get_exec = lambda: types.SimpleNamespace(comm=types.SimpleNamespace(enable_scattered_sconv=False))


def sglang_per_req(architecture: str, tp: int) -> tuple[int, int]:
    module, cls, raw, where = FAMILIES[architecture]
    _patch_parallel(tp)
    config = getattr(importlib.import_module(f"sglang.srt.configs.{module}"), cls)(**json.loads(json.dumps(raw)))
    holder = getattr(config, where) if where else config
    params = holder.mamba2_cache_params
    return params.mamba_cache_per_req, len(params.layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from advisor.model.state_shapes import model_bytes

    truth: dict[str, dict[str, int]] = {}
    bad = 0
    print("| architecture | attention TP | SGLang `mamba_cache_per_req` | advisor | state layers | match |")
    print("|---|---|---|---|---|---|")
    for architecture, (_, _, raw, _) in FAMILIES.items():
        config = {"architectures": [architecture], **raw}
        for tp in (1, 2, 4):
            try:
                expected, layers = sglang_per_req(architecture, tp)
            except Exception as exc:  # a TP the model cannot shard: SGLang refuses it too
                print(f"| {architecture} | {tp} | refused ({type(exc).__name__}) | - | - | - |")
                continue
            got = model_bytes(config, tp_size=tp)
            ok = got.state_bytes_per_slot == expected and got.num_linear_layers == layers
            bad += not ok
            truth[f"{architecture}@tp{tp}"] = {"mamba_cache_per_req": expected, "layers": layers}
            print(f"| {architecture} | {tp} | {expected} | {got.state_bytes_per_slot} | {layers} | {'yes' if ok else 'NO'} |")
        if args.write is not None:
            args.write.mkdir(parents=True, exist_ok=True)
            (args.write / f"{architecture}.json").write_text(json.dumps(config, indent=1) + "\n")
    if args.write is not None:
        (args.write / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    print(f"\n{len(truth) - bad}/{len(truth)} rows match")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
