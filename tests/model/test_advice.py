"""The seed's procedure end to end: pin rule, free lever, caveats and the flag line."""

import pytest

from advisor.model.advice import MemoryFacts, advise, free_lever
from advisor.model.pools import GIB, ByteConstants
from advisor.model.serving import ServingConfig

CONSTANTS = ByteConstants(13.50 * GIB / 258, 15.03 * GIB / 1167553)
REST = 28.53 * GIB


def test_balanced_at_the_optimum():
    advice = advise(ServingConfig(strategy="extra_buffer_lazy"), CONSTANTS, 9216, rest_bytes=REST)
    assert advice.ratio == pytest.approx(1.76, abs=0.01)
    assert advice.binding_pool == "balanced"
    assert advice.pin_max_mamba_cache_size is None
    assert advice.flag_line == "--mamba-full-memory-ratio 1.76"


def test_long_context_switches_to_pin():
    advice = advise(ServingConfig(strategy="extra_buffer"), CONSTANTS, 200_000, rest_bytes=REST)
    assert advice.ratio < 0.15
    assert advice.pin_max_mamba_cache_size is not None
    assert advice.pin_max_mamba_cache_size % 5 == 0
    assert advice.flag_line.startswith("--max-mamba-cache-size ")
    # the pinned concurrency is the balance point: both pools hold about the same number of requests
    per_request = 5 * CONSTANTS.state_bytes_per_slot + 200_000 * CONSTANTS.kv_bytes_per_token
    assert advice.pin_max_mamba_cache_size // 5 == int(REST / per_request)


def test_dcp_recommends_pin_and_says_the_draft_kv_is_unpriced():
    advice = advise(
        ServingConfig(strategy="extra_buffer_lazy", dcp_size=8, speculative_algorithm="EAGLE", draft_tokens=4),
        CONSTANTS,
        9216,
        rest_bytes=REST,
    )
    assert advice.pin_max_mamba_cache_size is not None
    assert any("draft model's KV is unknown" in note for note in advice.notes)
    priced = advise(
        ServingConfig(strategy="extra_buffer_lazy", dcp_size=8, speculative_algorithm="EAGLE", draft_tokens=4),
        ByteConstants(CONSTANTS.state_bytes_per_slot, CONSTANTS.kv_bytes_per_token, 2000.0), 9216, rest_bytes=REST,
    )
    assert any("priced inside each token's cell" in note for note in priced.notes)


def test_free_lever_from_idle_memory():
    value, note = free_lever(MemoryFacts(card_available_gib=177.53, idle_after_pools_gib=31.84, idle_after_graphs_gib=29.97, mem_fraction_static=0.85))
    assert value == 0.92 and note is not None
    assert free_lever(MemoryFacts(card_available_gib=177.53, idle_after_graphs_gib=3.0, mem_fraction_static=0.85)) == (None, None)


def test_accuracy_gates_and_replayssm_note():
    advice = advise(
        ServingConfig(kv_cache_dtype="fp8_e4m3", mamba_ssm_dtype="bfloat16", speculative_algorithm="EAGLE", draft_tokens=8, replayssm=True),
        CONSTANTS,
        9216,
    )
    joined = " ".join(advice.notes)
    assert "fp8_e4m3" in joined and "bfloat16" in joined and "ReplaySSM" in joined
    assert advice.draft_tokens == 0
    assert advice.predicted_max_running_requests is None


def test_rejects_nonpositive_context():
    with pytest.raises(ValueError, match="context length"):
        advise(ServingConfig(), CONSTANTS, 0)
