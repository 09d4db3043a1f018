"""State bytes per slot of every hybrid family SGLang 0.5.23 knows equal its own `mamba_cache_per_req`.

`data/family_configs/` was written by tools/sglang_families.py: a config.json per family, and in `truth.json`
what SGLang 0.5.23's own config class (`configs/*.py` `mamba2_cache_params`, chosen as `configs/hybrid_arch.py`
~55-155 does) computed at attention-TP 1, 2 and 4. Paths are under python/sglang/srt/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.model.serving import EXTRA_BUFFER_ARCHITECTURES
from advisor.model.state_shapes import SUPPORTED_ARCHITECTURES, linear_family_of, model_bytes
from advisor.sources.hf_config import load_hf_config

FAMILIES = Path(__file__).resolve().parent / "data" / "family_configs"
TRUTH = json.loads((FAMILIES / "truth.json").read_text())


@pytest.mark.parametrize("key", sorted(TRUTH))
def test_state_bytes_equal_sglangs_config_class(key):
    architecture, _, tp = key.partition("@tp")
    config = load_hf_config(FAMILIES / f"{architecture}.json")
    derived = model_bytes(config, tp_size=int(tp))
    assert derived.state_bytes_per_slot == TRUTH[key]["mamba_cache_per_req"]
    assert derived.num_linear_layers == TRUTH[key]["layers"]


def test_every_family_of_the_issue_list_is_read():
    # configs/hybrid_arch.py ~55-155 and arg_groups/overrides.py ~369-398 (`_MAMBA_RADIX_CACHE_ARCHS`)
    named = {
        "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration", "ZayaForCausalLM", "JetNemotronForCausalLM",
        "JetVLMForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
        "MiniCPMV4_7ForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
        "BailingMoeV3VLForConditionalGeneration", "KimiK3ForConditionalGeneration",
        "Glm5NextForConditionalGeneration", "Qwen4ExpForConditionalGeneration", "NemotronHPuzzleForCausalLM",
        "NemotronH_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2", "GigaChat35ForCausalLM", "Mamba2ForCausalLM",
        "InklingForConditionalGeneration",
    }
    assert named <= set(SUPPORTED_ARCHITECTURES)
    tested = {key.partition("@")[0] for key in TRUTH}
    assert named - tested == {"BailingMoeV3VLForConditionalGeneration"}  # the V3 reader under text_config


def test_the_replayssm_families_are_gdn_and_kda():
    # kv_cache_configurator.py ~3269-3271: ReplaySSM acts on `hybrid_gdn_config` or `hybrid_kda_config` models
    assert linear_family_of("GigaChat35ForCausalLM") == linear_family_of("JetNemotronForCausalLM") == "gdn"
    assert linear_family_of("Glm5NextForConditionalGeneration") == linear_family_of("KimiK3ForConditionalGeneration") == "kda"
    assert linear_family_of("Lfm2MoeForCausalLM") == "shortconv" and "Lfm2MoeForCausalLM" not in EXTRA_BUFFER_ARCHITECTURES
