"""S and D from the serving config: the seed's table, SGLang's auto resolution and the overlap rules."""

import pytest

from advisor.model.serving import (
    ConfigError,
    ServingConfig,
    effective_draft_tokens,
    resolve_strategy,
    slots_per_request,
)


@pytest.mark.parametrize(
    ("kwargs", "expected", "expected_with_skip"),
    [
        ({"disable_radix_cache": True}, 1, 1),
        ({"strategy": "no_buffer", "disable_overlap_schedule": True}, 3, 3),
        ({"strategy": "extra_buffer"}, 5, 4),
        ({"strategy": "extra_buffer", "disable_overlap_schedule": True}, 4, 3),
        ({"strategy": "extra_buffer_lazy"}, 4, 3),
    ],
)
def test_seed_s_table(kwargs, expected, expected_with_skip):
    assert slots_per_request(ServingConfig(**kwargs)) == expected
    assert slots_per_request(ServingConfig(skip_decode_lock=True, **kwargs)) == expected_with_skip


def test_pipeline_parallel_turns_overlap_off():
    assert slots_per_request(ServingConfig(strategy="extra_buffer", pp_size=2)) == 4


def test_auto_resolves_like_sglang():
    assert resolve_strategy(ServingConfig()) == "extra_buffer"
    # overlap off and no paging -> no_buffer
    assert resolve_strategy(ServingConfig(disable_overlap_schedule=True)) == "no_buffer"
    # paging still wants the extra buffer with overlap off
    assert resolve_strategy(ServingConfig(disable_overlap_schedule=True, page_size=64)) == "extra_buffer"
    assert resolve_strategy(ServingConfig(supports_extra_buffer=False)) == "no_buffer"
    assert resolve_strategy(ServingConfig(disable_radix_cache=True)) == "none"
    assert slots_per_request(ServingConfig(disable_overlap_schedule=True)) == 3


def test_lazy_without_overlap_is_refused():
    with pytest.raises(ConfigError, match="overlap"):
        slots_per_request(ServingConfig(strategy="extra_buffer_lazy", disable_overlap_schedule=True))


def test_draft_tokens_and_replayssm():
    assert effective_draft_tokens(ServingConfig()) == 0
    assert effective_draft_tokens(ServingConfig(speculative_algorithm="EAGLE", draft_tokens=4)) == 4
    assert effective_draft_tokens(ServingConfig(speculative_algorithm="EAGLE", draft_tokens=8, replayssm=True)) == 0


@pytest.mark.parametrize("bad", [{"strategy": "lazy"}, {"tp_size": 0}, {"draft_tokens": -1}, {"mamba_full_memory_ratio": 0}])
def test_invalid_config_names_the_field(bad):
    with pytest.raises(ConfigError) as err:
        ServingConfig(**bad)
    assert next(iter(bad)).split("_")[0] in str(err.value)
