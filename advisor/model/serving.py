"""The serving config of a hybrid SGLang server, as the dual-pool model needs it.

Pure data plus the rules that turn flags into S (state slots per running request) and D
(draft tokens charged per request). Mirrors SGLang 0.5.23 `mem_cache/kv_cache_configurator.py`
(`_calculate_mamba_ratio`, `_handle_max_mamba_cache`), `arg_groups/overrides.py`
(`_mamba_radix_cache_resolution`, `_MAMBA_EXTRA_BUFFER_ARCHS`) and `arg_groups/pipeline.py` (the order
in which the strategy and the PP overlap rule resolve).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")

# SGLang 0.5.23 kv_cache_configurator.py:222-229.
BASE_SLOTS_PER_REQUEST = 3
BASE_DROP_ON_SKIP_DECODE_LOCK = 1
NO_BUFFER_SLOT_ADDED_BACK_ON_SKIP = 1

# Where the decode-lock-skip flag (SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK) came from. SGLang only shows its
# environment in /server_info when started with SGLANG_EXPOSE_OWN_ENV_VARS=1
# (managers/scheduler_components/internal_state.py `_add_env_vars`), so on a default server it is assumed.
SKIP_SOURCE_ASSUMED = "assumed"  # not visible: assumed off (SGLang's default)
SKIP_SOURCE_ENV_VARS = "env_vars"  # read from /server_info's env_vars
SKIP_SOURCE_CONFIG = "config"  # set by the operator (advisor config), wins over the rest
# read back from the boot log's `N state slots per request` (the capped warning, kv_cache_configurator.py
# `resolve_max_num_reqs`): the S SGLang itself used
SKIP_SOURCE_BOOT_LOG = "boot_log"
SKIP_SOURCES = (SKIP_SOURCE_ASSUMED, SKIP_SOURCE_ENV_VARS, SKIP_SOURCE_CONFIG, SKIP_SOURCE_BOOT_LOG)

# Architectures with the extra track buffer (SGLang 0.5.23 arg_groups/overrides.py:401-436,
# `_MAMBA_EXTRA_BUFFER_ARCHS`); only on the triton linear-attention backend
# (`supports_mamba_cache_extra_buffer`). LFM2 (short conv) is not among them: auto -> no_buffer.
EXTRA_BUFFER_ARCHITECTURES = frozenset(
    {
        "KimiLinearForCausalLM",
        "KimiK3ForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen4ExpForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "MiniCPMV4_6ForConditionalGeneration",
        "MiniCPMV4_7ForConditionalGeneration",
        "BailingMoeV2_5ForCausalLM",
        "BailingMoeV3ForCausalLM",
        "BailingMoeV3VLForConditionalGeneration",
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "Glm5NextForConditionalGeneration",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "NemotronH_Omni_Reasoning_V3",
        "InklingForConditionalGeneration",
        "InklingForConditionalGenerationMTP",
    }
)
# Families whose ReplaySSM spec-verify is active (kv_cache_configurator.py `_handle_max_mamba_cache`:
# `enable_linear_replayssm_spec and (hybrid_gdn_config or hybrid_kda_config)`). Elsewhere the flag is inert.
REPLAYSSM_FAMILIES = frozenset({"gdn", "kda"})


def extra_buffer_capable(architecture: str | None, linear_attn_backend: str | None = "triton") -> bool:
    """Whether `auto` may pick extra_buffer for this model (`supports_mamba_cache_extra_buffer`).

    An unknown architecture counts as capable (the common hybrids all are); a non-triton
    linear-attention backend never is.
    """
    if linear_attn_backend is not None and linear_attn_backend != "triton":
        return False
    if architecture is None:
        return True
    return architecture in EXTRA_BUFFER_ARCHITECTURES


class ConfigError(ValueError):
    """A serving config that SGLang itself would refuse or that we cannot interpret."""


@dataclass(frozen=True)
class ServingConfig:
    """What of the launch flags matters to the two pools. Defaults are SGLang 0.5.23's."""

    strategy: str = "auto"
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    pp_size: int = 1
    tp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1
    dcp_size: int = 1
    page_size: int = 1
    skip_decode_lock: bool = False
    # Where skip_decode_lock came from (SKIP_SOURCES); "assumed" means SGLang did not show it.
    skip_decode_lock_source: str = SKIP_SOURCE_ASSUMED
    speculative_algorithm: str | None = None
    draft_tokens: int = 0
    replayssm: bool = False
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"
    mamba_ssm_dtype: str | None = None
    unified_memory: bool = False
    # Whether the model/platform supports the extra track buffer (triton linear-attn backend
    # on a supported architecture); only used to resolve strategy "auto".
    supports_extra_buffer: bool = True
    # The linear-attention family ("gdn", "kda", "mamba2", "mamba1", "shortconv"), when known: ReplaySSM
    # spec-verify only acts on GDN and KDA, and only KDA keeps its ring per slot.
    linear_family: str | None = None
    # --disaggregation-mode: "null", "prefill" or "decode". A PD prefill server never verifies drafts, so it
    # reserves no speculative state (kv_cache_configurator.py `_pd_prefill_skips_mamba_spec_state` ~172-181).
    disaggregation_mode: str = "null"
    extras: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown mamba radix cache strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        for name in ("pp_size", "tp_size", "dp_size", "attn_dp_size", "dcp_size", "page_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_tokens < 0:
            raise ConfigError(f"draft_tokens must be >= 0, got {self.draft_tokens}")
        if self.skip_decode_lock_source not in SKIP_SOURCES:
            raise ConfigError(
                f"skip_decode_lock_source must be one of {', '.join(SKIP_SOURCES)}, got {self.skip_decode_lock_source!r}"
            )
        if not self.mamba_full_memory_ratio > 0:
            raise ConfigError(f"mamba_full_memory_ratio must be > 0, got {self.mamba_full_memory_ratio}")

    def with_ratio(self, ratio: float) -> ServingConfig:
        return replace(self, mamba_full_memory_ratio=ratio, max_mamba_cache_size=None)

    def with_skip_decode_lock(self, skip: bool) -> ServingConfig:
        """The operator's word on SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK (the daemon config key); wins over all."""
        return replace(self, skip_decode_lock=skip, skip_decode_lock_source=SKIP_SOURCE_CONFIG)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extras", None)
        return out


def overlap_enabled(config: ServingConfig) -> bool:
    """Overlap counts as off with --disable-overlap-schedule or pp_size > 1."""
    return not config.disable_overlap_schedule and config.pp_size <= 1


def resolve_strategy(config: ServingConfig) -> str:
    """The strategy SGLang 0.5.23 actually runs. 'none' when the radix cache is off.

    `auto` resolves in `_mamba_radix_cache_resolution` (arg_groups/overrides.py:477-486), called from
    `handle_model_specific_adjustments` (arg_groups/pipeline.py:225) BEFORE `_pipeline_parallel_overlap_disable`
    (pipeline.py:302) turns overlap off for pp_size > 1: so PP alone still resolves to extra_buffer.
    """
    if config.disable_radix_cache:
        return "none"
    if config.strategy != "auto":
        return config.strategy
    wants_overlap = not config.disable_overlap_schedule
    wants_paging = config.page_size > 1
    if (wants_overlap or wants_paging) and config.supports_extra_buffer:
        return "extra_buffer"
    return "no_buffer"


def slots_per_request(config: ServingConfig) -> int:
    """S: state-pool slots one running request holds (SGLang's `_calculate_mamba_ratio`)."""
    strategy = resolve_strategy(config)
    if strategy == "none":
        return 1
    base = BASE_SLOTS_PER_REQUEST - (BASE_DROP_ON_SKIP_DECODE_LOCK if config.skip_decode_lock else 0)
    # no_buffer forces overlap off in SGLang; auto->no_buffer does the same.
    overlap = overlap_enabled(config) and strategy != "no_buffer"
    if strategy == "extra_buffer":
        tracking = 2 if overlap else 1
    elif strategy == "extra_buffer_lazy":
        if not overlap:
            raise ConfigError("extra_buffer_lazy requires the overlap scheduler (incompatible with --disable-overlap-schedule / pp_size > 1)")
        tracking = 1
    else:  # no_buffer
        tracking = NO_BUFFER_SLOT_ADDED_BACK_ON_SKIP if config.skip_decode_lock else 0
    return base + tracking


@dataclass(frozen=True)
class SlotsAssumption:
    """S with the decode-lock-skip assumption behind it spelled out, and S had the assumption gone the other way."""

    slots: int
    skip_decode_lock: bool
    source: str  # SKIP_SOURCES
    slots_if_other: int
    reason: str


def slots_assumption(config: ServingConfig) -> SlotsAssumption:
    """Which S the model uses and why: the skip flag is invisible on a default SGLang server."""
    slots = slots_per_request(config)
    other = slots_per_request(replace(config, skip_decode_lock=not config.skip_decode_lock))
    state = "on" if config.skip_decode_lock else "off"
    if config.skip_decode_lock_source == SKIP_SOURCE_CONFIG:
        reason = f"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK {state} per the advisor config: S = {slots}"
    elif config.skip_decode_lock_source == SKIP_SOURCE_ENV_VARS:
        reason = f"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK {state} per /server_info env_vars: S = {slots}"
    elif config.skip_decode_lock_source == SKIP_SOURCE_BOOT_LOG:
        reason = f"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK {state} per the boot log's state slots per request: S = {slots}"
    else:
        reason = (
            f"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK assumed {state} (not visible without SGLANG_EXPOSE_OWN_ENV_VARS=1): "
            f"S = {slots}, or {other} if the server sets it; set it in the advisor config to be sure"
        )
    return SlotsAssumption(slots, config.skip_decode_lock, config.skip_decode_lock_source, other, reason)


def assumed_slots_note(config: ServingConfig) -> str | None:
    """The sentence to show when S rests on an assumption that would change it (the skip flag not visible)."""
    assumption = slots_assumption(config)
    if assumption.source == SKIP_SOURCE_ASSUMED and assumption.slots_if_other != assumption.slots:
        return assumption.reason
    return None


def replayssm_active(config: ServingConfig) -> bool:
    """ReplaySSM spec-verify takes effect: the flag, spec on, and a GDN/KDA model (or an unknown family)."""
    if not (config.replayssm and spec_enabled(config)):
        return False
    return config.linear_family is None or config.linear_family in REPLAYSSM_FAMILIES


def spec_enabled(config: ServingConfig) -> bool:
    return config.draft_tokens > 0 or bool(config.speculative_algorithm)


def reserves_spec_state(config: ServingConfig) -> bool:
    """Whether the state budget holds the D intermediate states per request: spec on, ReplaySSM off, and not a
    PD prefill server (kv_cache_configurator.py `_handle_max_mamba_cache` ~3294-3298, ~172-181; unified memory
    keeps them)."""
    if not (spec_enabled(config) and config.draft_tokens > 0) or replayssm_active(config):
        return False
    return not (config.disaggregation_mode == "prefill" and not config.unified_memory)


def effective_draft_tokens(config: ServingConfig) -> int:
    """D: draft tokens charged per running request; 0 without spec, under an active ReplaySSM and on a PD prefill
    server."""
    if replayssm_active(config) or (spec_enabled(config) and not reserves_spec_state(config)):
        return 0
    return config.draft_tokens if spec_enabled(config) else 0
