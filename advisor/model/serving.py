"""The serving config of a hybrid SGLang server, as the dual-pool model needs it.

Pure data plus the rules that turn flags into S (state slots per running request) and D
(draft tokens charged per request). Mirrors SGLang 0.5.23 `mem_cache/kv_cache_configurator.py`
(`_calculate_mamba_ratio`) and `arg_groups/overrides.py` (`_mamba_radix_cache_resolution`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")

# SGLang 0.5.23 kv_cache_configurator.py:222-229.
BASE_SLOTS_PER_REQUEST = 3
BASE_DROP_ON_SKIP_DECODE_LOCK = 1
NO_BUFFER_SLOT_ADDED_BACK_ON_SKIP = 1


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
    extras: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown mamba radix cache strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        for name in ("pp_size", "tp_size", "dp_size", "attn_dp_size", "dcp_size", "page_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_tokens < 0:
            raise ConfigError(f"draft_tokens must be >= 0, got {self.draft_tokens}")
        if not self.mamba_full_memory_ratio > 0:
            raise ConfigError(f"mamba_full_memory_ratio must be > 0, got {self.mamba_full_memory_ratio}")

    def with_ratio(self, ratio: float) -> ServingConfig:
        return replace(self, mamba_full_memory_ratio=ratio, max_mamba_cache_size=None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extras", None)
        return out


def overlap_enabled(config: ServingConfig) -> bool:
    """Overlap counts as off with --disable-overlap-schedule or pp_size > 1."""
    return not config.disable_overlap_schedule and config.pp_size <= 1


def resolve_strategy(config: ServingConfig) -> str:
    """The strategy SGLang 0.5.23 actually runs. 'none' when the radix cache is off."""
    if config.disable_radix_cache:
        return "none"
    if config.strategy != "auto":
        return config.strategy
    wants_overlap = overlap_enabled(config)
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


def spec_enabled(config: ServingConfig) -> bool:
    return config.draft_tokens > 0 or bool(config.speculative_algorithm)


def effective_draft_tokens(config: ServingConfig) -> int:
    """D: draft tokens charged per running request; 0 without spec and 0 under ReplaySSM."""
    if config.replayssm:
        return 0
    return config.draft_tokens if spec_enabled(config) else 0
