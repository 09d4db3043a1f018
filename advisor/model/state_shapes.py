"""Derives the two per-GPU byte constants (state bytes per slot, KV bytes per token) from a HF config.json.

Pure: takes the parsed config dict and plain options and follows SGLang 0.5.23's own shape rules
(`configs/mamba_utils.py`, the per-model `configs/*.py`, `model_executor/pool_configurator.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from advisor.errors import InputError
from advisor.model.pools import ByteConstants

# Element sizes of the dtypes SGLang allows for the recurrent state (`mamba2_state_dtype`,
# `--mamba-ssm-dtype` choices, `SGLANG_MAMBA_CONV_DTYPE`).
_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_STATE_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
# SGLang's default when neither the config nor the flag names an SSM dtype (`mamba2_state_dtype`).
DEFAULT_SSM_DTYPE = "float32"

# `--kv-cache-dtype` values this module sizes (`mem_cache/kv_cache_dtype.py`); the scaled FP4/MXFP8
# layouts add scale buffers and are left out.
_KV_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelBytes:
    """Per-GPU byte constants of one hybrid model under one TP size and one set of dtypes."""

    family: str  # "mamba2" | "gdn" | "kda" | "lightning" | "mamba1" | "shortconv" | "cca" | "sconv"
    architecture: str
    num_linear_layers: int
    num_attention_layers: int
    conv_bytes_per_slot: int
    ssm_bytes_per_slot: int
    kv_bytes_per_token: int
    ssm_dtype: str = DEFAULT_SSM_DTYPE
    conv_dtype: str = "bfloat16"
    kv_dtype_bytes: int = 2
    dcp_size: int = 1
    pp_size: int = 1
    # Under PP, the share of all state layers each stage is charged for (the largest stage's share,
    # kv_cache_configurator.py `_handle_max_mamba_cache`); conv/ssm bytes above are whole-model.
    pp_state_share: float = 1.0
    # Attention layers the KV row covers (the fullest stage's under PP); None: all of them.
    kv_row_attention_layers: int | None = None

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes SGLang charges one slot on one GPU: `int(mamba_cache_per_req * pp_layer_scale)`."""
        return int((self.conv_bytes_per_slot + self.ssm_bytes_per_slot) * self.pp_state_share)

    @property
    def token_equiv(self) -> float:
        """Full-KV tokens one state slot costs; infinite for a model without attention layers."""
        if self.kv_bytes_per_token == 0:
            return math.inf
        return self.state_bytes_per_slot / self.kv_bytes_per_token

    def byte_constants(self) -> ByteConstants:
        """The pools-module view; raises InputError for a model without a KV pool to balance."""
        if self.kv_bytes_per_token == 0:
            raise InputError(
                f"{self.architecture} has no full-attention layers, so there is no KV pool to balance against"
            )
        return ByteConstants(
            state_bytes_per_slot=float(self.state_bytes_per_slot),
            kv_bytes_per_token=float(self.kv_bytes_per_token),
        )


# --- small readers that turn a bad config into a one-line error naming the field ---------------


class _Fields:
    """Typed access to one (sub-)config dict, with errors that name the architecture and field."""

    def __init__(self, data: Mapping[str, Any], architecture: str, prefix: str = "") -> None:
        self.data = data
        self.architecture = architecture
        self.prefix = prefix

    def _where(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def positive_int(self, name: str, default: int | None = None) -> int:
        value = self.data.get(name)
        if value is None:
            if default is not None:
                return default
            raise InputError(
                f"config field '{self._where(name)}' is missing (needed for {self.architecture})"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(
                f"config field '{self._where(name)}' must be a positive integer, got {value!r} ({self.architecture})"
            )
        return value

    def non_negative_int(self, name: str) -> int:
        value = self.data.get(name)
        if value is None:
            raise InputError(
                f"config field '{self._where(name)}' is missing (needed for {self.architecture})"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                f"config field '{self._where(name)}' must be an integer >= 0, got {value!r} ({self.architecture})"
            )
        return value

    def string_list(self, name: str) -> list[str]:
        value = self.data.get(name)
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise InputError(
                f"config field '{self._where(name)}' must be a list of strings, got {value!r} ({self.architecture})"
            )
        return value

    def int_list(self, name: str) -> list[int]:
        value = self.data.get(name)
        if not isinstance(value, list) or not all(
            isinstance(item, int) and not isinstance(item, bool) for item in value
        ):
            raise InputError(
                f"config field '{self._where(name)}' must be a list of integers, got {value!r} ({self.architecture})"
            )
        return value

    def sub(self, name: str) -> _Fields:
        value = self.data.get(name)
        if not isinstance(value, dict):
            raise InputError(
                f"config field '{self._where(name)}' must be an object, got {value!r} ({self.architecture})"
            )
        return _Fields(value, self.architecture, prefix=f"{self._where(name)}.")


def _divide(numerator: int, tp_size: int, what: str, architecture: str) -> int:
    """SGLang's `distributed.utils.divide`: an exact split across TP ranks or no boot at all."""
    if numerator % tp_size != 0:
        raise InputError(
            f"{architecture}: {what} ({numerator}) is not divisible by tp_size {tp_size}; SGLang cannot shard it"
        )
    return numerator // tp_size


# --- per-rank state shapes (elements per layer per slot) ----------------------------------------


@dataclass(frozen=True)
class _StateShape:
    conv_elements: int  # one layer's conv window, one slot, one rank
    ssm_elements: int  # one layer's temporal (SSM) state, one slot, one rank


def _mamba2_shape(
    *,
    tp_size: int,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
    architecture: str,
) -> _StateShape:
    """`Mamba2StateShape.create`: groups widened to tp_size when they do not split evenly."""
    if n_groups % tp_size != 0:
        # `extra_groups_for_head_shards` adds tp_size - n_groups, i.e. the groups become tp_size.
        n_groups = tp_size
    conv_dim = intermediate_size + 2 * n_groups * state_size
    conv_channels = _divide(conv_dim, tp_size, "conv dim", architecture)
    heads_per_rank = _divide(num_heads, tp_size, "SSM heads", architecture)
    return _StateShape(
        conv_elements=conv_channels * (conv_kernel - 1),
        ssm_elements=heads_per_rank * head_dim * state_size,
    )


def _mamba1_shape(
    *, tp_size: int, intermediate_size: int, state_size: int, conv_kernel: int, architecture: str
) -> _StateShape:
    """`Mamba2StateShape.create_full_rank`: conv over the intermediate channels only, head_dim 1."""
    channels = _divide(intermediate_size, tp_size, "intermediate_size", architecture)
    return _StateShape(conv_elements=channels * (conv_kernel - 1), ssm_elements=channels * state_size)


def _kda_shape(
    *, tp_size: int, num_heads: int, head_dim: int, conv_kernel: int, architecture: str
) -> _StateShape:
    """`KimiLinearStateShape.create`: q, k, v conv windows side by side; (heads, d, d) state."""
    projection = num_heads * head_dim  # key heads and key dim default to the value ones
    q_channels = _divide(projection, tp_size, "KDA projection size", architecture)
    k_channels = _divide(projection, tp_size, "KDA key projection size", architecture)
    heads_per_rank = _divide(num_heads, tp_size, "KDA heads", architecture)
    return _StateShape(
        conv_elements=(conv_kernel - 1) * (q_channels + 2 * k_channels),
        ssm_elements=heads_per_rank * head_dim * head_dim,
    )


# --- per-architecture readers ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    family: str
    linear_layers: int
    attention_layers: int
    shape: _StateShape
    # Whether SGLang passes the config to `mamba2_state_dtype` (config mamba_ssm_dtype honoured)
    # or builds the params with the default dtype (config value ignored; only the flag counts).
    reads_config_ssm_dtype: bool
    attention: _Fields | None  # where the attention fields live; None without attention layers
    mla: bool = False
    # 0-based layer ids of the state-keeping and the full-attention layers, and the model's layer count
    # (what `get_pp_indices` splits across pipeline stages).
    linear_ids: tuple[int, ...] = ()
    attention_ids: tuple[int, ...] = ()
    num_layers: int = 0


_QWEN4_ATTENTION_TYPES = ("full_attention", "qwen_sparse_attention", "indexed_attention")


def _gdn_layer_kinds(fields: _Fields, num_layers: int) -> list[str]:
    """'attention' / 'linear' per layer: every full_attention_interval-th layer is attention
    (`configs/qwen3_next.py` `layers_block_type`); Qwen4-Exp's text config reads `layer_types` instead
    (`configs/qwen4_exp.py` ~83-95)."""
    if fields.architecture.startswith("Qwen4Exp") and fields.has("layer_types"):
        kinds = fields.string_list("layer_types")
        if len(kinds) != num_layers:
            raise InputError(
                f"config field '{fields.prefix}layer_types' has {len(kinds)} entries but num_hidden_layers is "
                f"{num_layers} ({fields.architecture})"
            )
        return ["attention" if kind in _QWEN4_ATTENTION_TYPES else
                "linear" if kind == "linear_attention" else kind for kind in kinds]
    interval = fields.positive_int("full_attention_interval")
    return ["attention" if (layer + 1) % interval == 0 else "linear" for layer in range(num_layers)]


def _gdn_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Qwen3-Next / Qwen3.5 / Qwen4-Exp / InternS2 / MiniCPM-V 4.6-4.7 (`configs/qwen3_next.py`
    `mamba2_cache_params`), and GigaChat 3.5 (`configs/gigachat35.py`, the same GDN fields)."""
    num_layers = fields.positive_int("num_hidden_layers")
    kinds = (_gigachat_layer_kinds(fields, num_layers) if fields.architecture.startswith("GigaChat35")
             else _gdn_layer_kinds(fields, num_layers))
    attention_layers = kinds.count("attention")
    key_heads = fields.positive_int("linear_num_key_heads")
    value_heads = fields.positive_int("linear_num_value_heads")
    key_dim = fields.positive_int("linear_key_head_dim")
    value_dim = fields.positive_int("linear_value_head_dim")
    shape = _mamba2_shape(
        tp_size=tp_size,
        intermediate_size=value_dim * value_heads,
        n_groups=key_heads,
        num_heads=value_heads,
        head_dim=value_dim,
        state_size=key_dim,
        conv_kernel=fields.positive_int("linear_conv_kernel_dim"),
        architecture=fields.architecture,
    )
    attention_ids = tuple(layer for layer, kind in enumerate(kinds) if kind == "attention")
    linear_ids = tuple(layer for layer, kind in enumerate(kinds) if kind == "linear")
    return _Layout(
        "gdn", len(linear_ids), attention_layers, shape, True, fields,
        linear_ids=linear_ids, attention_ids=attention_ids, num_layers=num_layers,
    )


def _gigachat_layer_kinds(fields: _Fields, num_layers: int) -> list[str]:
    """GigaChat 3.5 (`configs/gigachat35.py` `_resolve_layer_types`): explicit `layer_types`, else the
    `full_attention_layers` ids, else all linear."""
    if fields.has("layer_types"):
        kinds = fields.string_list("layer_types")
        if len(kinds) != num_layers:
            raise InputError(
                f"config field '{fields.prefix}layer_types' must have num_hidden_layers ({num_layers}) entries "
                f"({fields.architecture})"
            )
        return ["attention" if kind in ("full_attention", "attention") else "linear" for kind in kinds]
    full = set(fields.int_list("full_attention_layers")) if fields.has("full_attention_layers") else set()
    return ["attention" if layer in full else "linear" for layer in range(num_layers)]


_NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _nemotron_h_layout(fields: _Fields, tp_size: int) -> _Layout:
    """NemotronH (`configs/nemotron_h.py`): layers_block_type, else the legacy hybrid_override_pattern."""
    if fields.has("layers_block_type"):
        block_types = fields.string_list("layers_block_type")
    elif fields.has("hybrid_override_pattern"):
        pattern = fields.data["hybrid_override_pattern"]
        if not isinstance(pattern, str) or any(char not in _NEMOTRON_PATTERN for char in pattern):
            raise InputError(
                f"config field 'hybrid_override_pattern' must use only M, *, - and E, got {pattern!r} "
                f"({fields.architecture})"
            )
        block_types = [_NEMOTRON_PATTERN[char] for char in pattern]
    else:
        raise InputError(
            f"config field 'hybrid_override_pattern' (or 'layers_block_type') is missing "
            f"(needed for {fields.architecture})"
        )
    unknown = sorted(set(block_types) - set(_NEMOTRON_PATTERN.values()))
    if unknown:
        raise InputError(
            f"config field 'layers_block_type' has unknown types {unknown}; SGLang accepts mamba, attention, "
            f"mlp, moe ({fields.architecture})"
        )
    num_heads = fields.positive_int("mamba_num_heads")
    head_dim = fields.positive_int("mamba_head_dim")
    # SGLang reads `n_groups` (a raw config.json key); `mamba_n_groups` is the constructor spelling.
    n_groups = (
        fields.positive_int("n_groups") if fields.has("n_groups") else fields.positive_int("mamba_n_groups")
    )
    conv_kernel = (
        fields.positive_int("conv_kernel")
        if fields.has("conv_kernel")
        else fields.positive_int("mamba_d_conv", 4)
    )
    shape = _mamba2_shape(
        tp_size=tp_size,
        intermediate_size=num_heads * head_dim,
        n_groups=n_groups,
        num_heads=num_heads,
        head_dim=head_dim,
        state_size=fields.positive_int("ssm_state_size"),
        conv_kernel=conv_kernel,
        architecture=fields.architecture,
    )
    return _Layout(
        "mamba2", block_types.count("mamba"), block_types.count("attention"), shape, True, fields,
        linear_ids=tuple(i for i, kind in enumerate(block_types) if kind == "mamba"),
        attention_ids=tuple(i for i, kind in enumerate(block_types) if kind == "attention"),
        num_layers=len(block_types),
    )


def _falcon_h1_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Falcon-H1 (`configs/falcon_h1.py`): every layer runs attention and Mamba2 in parallel."""
    num_layers = fields.positive_int("num_hidden_layers")
    num_heads = fields.positive_int("mamba_n_heads")
    if "mamba_d_ssm" in fields.data and fields.data["mamba_d_ssm"] is None:
        # An explicit null means "mamba_expand * hidden_size" in SGLang's FalconH1Config.
        intermediate = fields.positive_int("mamba_expand", 2) * fields.positive_int("hidden_size")
    else:
        intermediate = fields.positive_int("mamba_d_ssm")
    head_dim_value = fields.data.get("mamba_d_head", "auto")
    if head_dim_value == "auto":
        if intermediate % num_heads != 0:
            raise InputError(
                f"mamba_n_heads ({num_heads}) must divide the mamba intermediate size ({intermediate}) "
                f"({fields.architecture})"
            )
        head_dim = intermediate // num_heads
    else:
        head_dim = fields.positive_int("mamba_d_head")
    shape = _mamba2_shape(
        tp_size=tp_size,
        intermediate_size=intermediate,
        n_groups=fields.positive_int("mamba_n_groups", 1),
        num_heads=num_heads,
        head_dim=head_dim,
        state_size=fields.positive_int("mamba_d_state"),
        conv_kernel=fields.positive_int("mamba_d_conv", 4),
        architecture=fields.architecture,
    )
    every = tuple(range(num_layers))
    return _Layout(
        "mamba2", num_layers, num_layers, shape, True, fields,
        linear_ids=every, attention_ids=every, num_layers=num_layers,
    )


_GRANITE_ALIASES = {"linear_attention": "mamba", "full_attention": "attention"}


def _granite_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Granite-4.0-H (`configs/granitemoehybrid.py`); builds its params without the config's dtype."""
    num_layers = fields.positive_int("num_hidden_layers")
    if fields.has("layer_types"):
        layer_types = [_GRANITE_ALIASES.get(kind, kind) for kind in fields.string_list("layer_types")]
    else:
        layer_types = ["attention" if (layer + 1) % 6 == 0 else "mamba" for layer in range(num_layers)]
    if len(layer_types) != num_layers:
        raise InputError(
            f"config field 'layer_types' has {len(layer_types)} entries but num_hidden_layers is {num_layers} "
            f"({fields.architecture})"
        )
    unknown = sorted(set(layer_types) - {"mamba", "attention"})
    if unknown:
        raise InputError(
            f"config field 'layer_types' has unknown types {unknown}; SGLang accepts mamba and attention "
            f"({fields.architecture})"
        )
    if "mamba" not in layer_types:
        raise InputError(
            f"{fields.architecture}: layer_types has no mamba layer, so SGLang keeps no state pool"
        )
    hidden_size = fields.positive_int("hidden_size")
    intermediate = fields.positive_int("mamba_expand", 2) * hidden_size
    num_heads = fields.positive_int("mamba_n_heads")
    head_dim = fields.positive_int("mamba_d_head")
    if num_heads * head_dim != intermediate:
        raise InputError(
            f"mamba_d_head ({head_dim}) * mamba_n_heads ({num_heads}) must equal mamba_expand * hidden_size "
            f"({intermediate}) ({fields.architecture})"
        )
    shape = _mamba2_shape(
        tp_size=tp_size,
        intermediate_size=intermediate,
        n_groups=fields.positive_int("mamba_n_groups", 1),
        num_heads=num_heads,
        head_dim=head_dim,
        state_size=fields.positive_int("mamba_d_state"),
        conv_kernel=fields.positive_int("mamba_d_conv", 4),
        architecture=fields.architecture,
    )
    return _Layout(
        "mamba2", layer_types.count("mamba"), layer_types.count("attention"), shape, False, fields,
        linear_ids=tuple(i for i, kind in enumerate(layer_types) if kind == "mamba"),
        attention_ids=tuple(i for i, kind in enumerate(layer_types) if kind == "attention"),
        num_layers=num_layers,
    )


def _kimi_linear_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Kimi-Linear (`configs/kimi_linear.py`): 1-indexed kda_layers, MLA on the rest; default dtype."""
    num_layers = fields.positive_int("num_hidden_layers")
    linear = fields.sub("linear_attn_config")
    kda_layers = set(linear.int_list("kda_layers"))
    linear.int_list("full_attn_layers")  # SGLang asserts it is present
    linear_layers = sum(1 for layer in range(num_layers) if (layer + 1) in kda_layers)
    shape = _kda_shape(
        tp_size=tp_size,
        num_heads=linear.positive_int("num_heads"),
        head_dim=linear.positive_int("head_dim"),
        conv_kernel=linear.positive_int("short_conv_kernel_size"),
        architecture=fields.architecture,
    )
    return _Layout(
        "kda", linear_layers, num_layers - linear_layers, shape, False, fields, mla=True,
        linear_ids=tuple(layer for layer in range(num_layers) if (layer + 1) in kda_layers),
        attention_ids=tuple(layer for layer in range(num_layers) if (layer + 1) not in kda_layers),
        num_layers=num_layers,
    )


def _mamba1_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Mamba-1 / Falcon-Mamba (`configs/mamba.py`): every layer is Mamba, no attention, default dtype."""
    num_layers = fields.positive_int("num_hidden_layers")
    # transformers' MambaConfig sets intermediate_size = int(expand * hidden_size) itself.
    intermediate = fields.positive_int("expand", 2) * fields.positive_int("hidden_size")
    shape = _mamba1_shape(
        tp_size=tp_size,
        intermediate_size=intermediate,
        state_size=fields.positive_int("state_size"),
        conv_kernel=fields.positive_int("conv_kernel", 4),
        architecture=fields.architecture,
    )
    return _Layout("mamba1", num_layers, 0, shape, False, None, linear_ids=tuple(range(num_layers)), num_layers=num_layers)


def _lfm2_layout(fields: _Fields, tp_size: int) -> _Layout:
    """LFM2 (`configs/lfm2.py`): short-conv layers keep only a conv window (state_size 0)."""
    num_layers = fields.positive_int("num_hidden_layers")
    if fields.has("layer_types"):
        layer_types = fields.string_list("layer_types")
    else:
        attention_ids = (
            set(fields.int_list("full_attn_idxs")) if fields.has("full_attn_idxs") else set(range(num_layers))
        )
        layer_types = ["full_attention" if layer in attention_ids else "conv" for layer in range(num_layers)]
    conv_layers = sum(1 for kind in layer_types if kind in ("conv", "short_conv"))
    if conv_layers == 0:
        raise InputError(
            f"{fields.architecture}: layer_types has no conv layer, so SGLang keeps no state pool"
        )
    shape = _mamba2_shape(
        tp_size=tp_size,
        intermediate_size=fields.positive_int("hidden_size"),
        n_groups=1,
        num_heads=tp_size,
        head_dim=fields.positive_int("hidden_size"),
        state_size=0,
        conv_kernel=fields.positive_int("conv_L_cache", 3),
        architecture=fields.architecture,
    )
    return _Layout(
        "shortconv", conv_layers, layer_types.count("full_attention"), shape, True, fields,
        linear_ids=tuple(i for i, kind in enumerate(layer_types) if kind in ("conv", "short_conv")),
        attention_ids=tuple(i for i, kind in enumerate(layer_types) if kind == "full_attention"),
        num_layers=len(layer_types),
    )


def _jet_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Jet-Nemotron / JetVLM (`configs/jet_nemotron.py`): JetBlock layers with GDN-shaped state from
    `efficient_attention_config.jet` (v heads = head_dim x expand_v); `attn`/`swa` layers keep KV."""
    kinds = fields.string_list("layer_types")
    jet = fields.sub("efficient_attention_config").sub("jet")
    heads = jet.positive_int("num_heads")
    head_k = jet.positive_int("head_dim")
    expand = jet.data.get("expand_v", 1)
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or expand <= 0:
        raise InputError(f"config field '{jet.prefix}expand_v' must be a positive number ({fields.architecture})")
    head_v = int(head_k * expand)
    shape = _mamba2_shape(
        tp_size=tp_size, intermediate_size=heads * head_v, n_groups=heads, num_heads=heads, head_dim=head_v,
        state_size=head_k, conv_kernel=jet.positive_int("conv_size"), architecture=fields.architecture,
    )
    linear_ids = tuple(i for i, kind in enumerate(kinds) if kind == "jet")
    attention_ids = tuple(i for i, kind in enumerate(kinds) if kind in ("attn", "swa"))
    return _Layout("gdn", len(linear_ids), len(attention_ids), shape, True, fields,
                   linear_ids=linear_ids, attention_ids=attention_ids, num_layers=len(kinds))


def _mamba2_pure_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Pure Mamba-2 (`configs/mamba2.py`, e.g. Mamba-Codestral): every layer is Mamba-2, no attention; SGLang
    shards its state by the full `tp_size`; default dtypes."""
    num_layers = fields.positive_int("num_hidden_layers")
    hidden = fields.positive_int("hidden_size")
    intermediate = (fields.positive_int("intermediate_size") if fields.has("intermediate_size")
                    else int(fields.positive_int("expand", 2) * hidden))
    shape = _mamba2_shape(
        tp_size=tp_size, intermediate_size=intermediate, n_groups=fields.positive_int("n_groups", 1),
        num_heads=fields.positive_int("num_heads"), head_dim=fields.positive_int("head_dim"),
        state_size=fields.positive_int("state_size"), conv_kernel=fields.positive_int("conv_kernel", 4),
        architecture=fields.architecture,
    )
    return _Layout("mamba2", num_layers, 0, shape, False, None, linear_ids=tuple(range(num_layers)),
                   num_layers=num_layers)


def _kda_state_shape(fields: _Fields, tp_size: int, heads_field: str, dim_field: str, kernel_field: str) -> _StateShape:
    return _kda_shape(
        tp_size=tp_size, num_heads=fields.positive_int(heads_field), head_dim=fields.positive_int(dim_field),
        conv_kernel=fields.positive_int(kernel_field), architecture=fields.architecture,
    )


def _glm5_next_layout(fields: _Fields, tp_size: int) -> _Layout:
    """GLM-5-Next (`configs/glm5_next.py` ~244-268): KDA on the 0-indexed `linear_attn_config.kda_layers`,
    full attention elsewhere; default dtypes."""
    num_layers = fields.positive_int("num_hidden_layers")
    linear = fields.sub("linear_attn_config")
    kda = set(linear.int_list("kda_layers"))
    shape = _kda_state_shape(linear, tp_size, "num_heads", "head_dim", "short_conv_kernel_size")
    linear_ids = tuple(i for i in range(num_layers) if i in kda)
    attention_ids = tuple(i for i in range(num_layers) if i not in kda)
    return _Layout("kda", len(linear_ids), len(attention_ids), shape, False, fields, mla=fields.has("kv_lora_rank"),
                   linear_ids=linear_ids, attention_ids=attention_ids, num_layers=num_layers)


def _bailing_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Bailing-MoE V2.5 / V3 (`configs/bailing_hybrid.py` ~171-236): `layer_group_size` marks attention layers
    (every n-th, or a per-layer list where 1 is linear); `use_kda` gives KDA state, else lightning attention
    (a (heads, d, d) state, no conv). Default dtypes."""
    num_layers = fields.positive_int("num_hidden_layers")
    group = fields.data.get("layer_group_size")
    if isinstance(group, list):
        groups = fields.int_list("layer_group_size")
        if len(groups) != num_layers:
            raise InputError(
                f"config field '{fields.prefix}layer_group_size' must have num_hidden_layers entries ({fields.architecture})"
            )
        kinds = ["linear" if value == 1 else "attention" for value in groups]
    else:
        every = fields.positive_int("layer_group_size")
        kinds = ["attention" if (layer + 1) % every == 0 else "linear" for layer in range(num_layers)]
    if fields.data.get("use_kda"):
        shape = _kda_state_shape(fields, tp_size, "num_attention_heads", "head_dim", "short_conv_kernel_size")
        family = "kda"
    else:
        heads = fields.positive_int("num_linear_key_value_heads") if fields.has("num_linear_key_value_heads") \
            else fields.positive_int("num_attention_heads")
        head_dim = fields.positive_int("head_dim")
        shape = _StateShape(conv_elements=0,
                            ssm_elements=_divide(heads, tp_size, "linear heads", fields.architecture) * head_dim * head_dim)
        family = "lightning"
    linear_ids = tuple(i for i, kind in enumerate(kinds) if kind == "linear")
    attention_ids = tuple(i for i, kind in enumerate(kinds) if kind == "attention")
    return _Layout(family, len(linear_ids), len(attention_ids), shape, False, fields, mla=fields.has("kv_lora_rank"),
                   linear_ids=linear_ids, attention_ids=attention_ids, num_layers=num_layers)


def _zaya_layout(fields: _Fields, tp_size: int) -> _Layout:
    """ZAYA1 (`configs/zaya.py` ~232-290): the CCA attention layers keep a conv state of
    ((heads + kv heads) x head_dim / tp) x (cca_time0 - 1 + cca_time1 - 1) plus hidden_size x 1, no SSM state,
    alongside their KV; sharded by the full tp_size."""
    num_layers = fields.positive_int("num_hidden_layers")
    if fields.has("zaya_layers"):
        kinds = fields.string_list("zaya_layers")
        layer_ids = tuple(i for i, kind in enumerate(kinds) if kind == "a")
        num_layers = len(kinds)
    else:
        layer_ids = tuple(i for i in range(num_layers) if i % 2 == 0)
    channels = (fields.positive_int("num_attention_heads") + fields.positive_int("num_key_value_heads")) * \
        fields.positive_int("head_dim")
    per_rank = _divide(channels, tp_size, "CCA channels", fields.architecture)
    padding = fields.positive_int("cca_time0") - 1 + fields.positive_int("cca_time1") - 1
    shape = _StateShape(conv_elements=per_rank * padding + fields.positive_int("hidden_size"), ssm_elements=0)
    return _Layout("cca", len(layer_ids), len(layer_ids), shape, True, fields,
                   linear_ids=layer_ids, attention_ids=layer_ids, num_layers=num_layers)


def _inkling_layout(fields: _Fields, tp_size: int) -> _Layout:
    """Inkling (`configs/inkling.py` ~217-257): every layer keeps six bf16 short-conv windows of
    (sconv_kernel_size - 1): two over the full-attention KV (max(1, kv heads / t) x head_dim), two over the SWA KV,
    two over the hidden stream (hidden_size; hidden / t only with --enable-scattered-sconv, not modelled); no SSM."""
    num_layers = fields.positive_int("num_hidden_layers")
    hidden = fields.positive_int("hidden_size")
    head_dim = (fields.positive_int("head_dim") if fields.has("head_dim")
                else hidden // fields.positive_int("num_attention_heads"))
    kv_heads = fields.positive_int("num_key_value_heads", 4)
    swa_heads = fields.positive_int("swa_num_key_value_heads") if fields.has("swa_num_key_value_heads") else kv_heads
    swa_dim = fields.positive_int("swa_head_dim") if fields.has("swa_head_dim") else head_dim
    full_kv = max(1, kv_heads // tp_size) * head_dim
    local_kv = max(1, swa_heads // tp_size) * swa_dim
    window = fields.positive_int("sconv_kernel_size", 4) - 1
    shape = _StateShape(conv_elements=window * 2 * (full_kv + local_kv + hidden), ssm_elements=0)
    every = tuple(range(num_layers))
    return _Layout("sconv", num_layers, num_layers, shape, False, fields,
                   linear_ids=every, attention_ids=every, num_layers=num_layers)


_LayoutReader = Callable[[_Fields, int], _Layout]

# architectures[0] -> (reader, whether the fields live under text_config). SGLang picks the config
# class by model_type and the pool rules by config class (`configs/hybrid_arch.py`).
_ARCHITECTURES: dict[str, tuple[_LayoutReader, str | None]] = {
    # GDN (configs/qwen3_next.py and the text configs built on it; configs/hybrid_arch.py `hybrid_gdn_config`)
    "Qwen3NextForCausalLM": (_gdn_layout, None),
    "Qwen3_5ForCausalLM": (_gdn_layout, None),
    "Qwen3_5MoeForCausalLM": (_gdn_layout, None),
    "Qwen3_5ForConditionalGeneration": (_gdn_layout, "text_config"),
    "Qwen3_5MoeForConditionalGeneration": (_gdn_layout, "text_config"),
    "Qwen4ExpForConditionalGeneration": (_gdn_layout, "text_config"),
    "InternS2PreviewForConditionalGeneration": (_gdn_layout, "text_config"),
    "InternS2MobiusForConditionalGeneration": (_gdn_layout, "text_config"),
    "MiniCPMV4_6ForConditionalGeneration": (_gdn_layout, "text_config"),
    "MiniCPMV4_7ForConditionalGeneration": (_gdn_layout, "text_config"),
    "GigaChat35ForCausalLM": (_gdn_layout, None),
    "JetNemotronForCausalLM": (_jet_layout, None),
    "JetVLMForConditionalGeneration": (_jet_layout, "text_config"),
    # Mamba-2 (configs/hybrid_arch.py `mamba2_config`)
    "NemotronHForCausalLM": (_nemotron_h_layout, None),
    "NemotronHPuzzleForCausalLM": (_nemotron_h_layout, None),
    "NemotronH_Nano_VL_V2": (_nemotron_h_layout, "llm_config"),
    "NemotronH_Omni_Reasoning_V3": (_nemotron_h_layout, "llm_config"),
    "FalconH1ForCausalLM": (_falcon_h1_layout, None),
    "GraniteMoeHybridForCausalLM": (_granite_layout, None),
    "Mamba2ForCausalLM": (_mamba2_pure_layout, None),
    "MambaForCausalLM": (_mamba1_layout, None),
    "FalconMambaForCausalLM": (_mamba1_layout, None),
    "Lfm2ForCausalLM": (_lfm2_layout, None),
    "Lfm2MoeForCausalLM": (_lfm2_layout, None),
    "Lfm2VlForConditionalGeneration": (_lfm2_layout, "text_config"),
    "ZayaForCausalLM": (_zaya_layout, None),
    "InklingForConditionalGeneration": (_inkling_layout, "text_config"),
    # KDA (configs/hybrid_arch.py `hybrid_kda_config`) and lightning attention (`hybrid_lightning_config`)
    "KimiLinearForCausalLM": (_kimi_linear_layout, None),
    "KimiK3ForConditionalGeneration": (_kimi_linear_layout, "text_config"),
    "Glm5NextForConditionalGeneration": (_glm5_next_layout, "text_config"),
    "BailingMoeV2_5ForCausalLM": (_bailing_layout, None),
    "BailingMoeV3ForCausalLM": (_bailing_layout, None),
    "BailingMoeV3VLForConditionalGeneration": (_bailing_layout, "text_config"),
}
_MODEL_TYPES = {
    "qwen3_next": "Qwen3NextForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "kimi_linear": "KimiLinearForCausalLM",
    "mamba": "MambaForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "falcon_mamba": "FalconMambaForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_moe": "Lfm2MoeForCausalLM",
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)
_FAMILY_OF_READER: dict[_LayoutReader, str] = {
    _gdn_layout: "gdn",
    _jet_layout: "gdn",
    _nemotron_h_layout: "mamba2",
    _falcon_h1_layout: "mamba2",
    _granite_layout: "mamba2",
    _mamba2_pure_layout: "mamba2",
    _kimi_linear_layout: "kda",
    _glm5_next_layout: "kda",
    _bailing_layout: "kda",  # or lightning without use_kda: see `linear_family_of`
    _mamba1_layout: "mamba1",
    _lfm2_layout: "shortconv",
    _zaya_layout: "cca",
    _inkling_layout: "sconv",
}


def linear_family_of(architecture: str) -> str | None:
    """The linear-attention family of a supported architecture ("gdn", "kda", ...), None when unknown."""
    entry = _ARCHITECTURES.get(architecture)
    return _FAMILY_OF_READER[entry[0]] if entry else None


def _architecture_of(hf_config: Mapping[str, Any]) -> str:
    architectures = hf_config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    model_type = hf_config.get("model_type")
    if isinstance(model_type, str) and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise InputError(
        f"config field 'architectures' is missing and model_type {model_type!r} is not a supported hybrid model"
    )


# --- dtypes ---------------------------------------------------------------------------------------


def _state_dtype_name(value: str, option: str) -> str:
    name = _STATE_DTYPE_ALIASES.get(value.lower(), value.lower())
    if name not in _STATE_DTYPE_BYTES:
        raise InputError(f"{option} must be one of float32, bfloat16, float16; got {value!r}")
    return name


def _config_ssm_dtype(hf_config: Mapping[str, Any]) -> str:
    """`mamba2_state_dtype(config)`: text_config.mamba_ssm_dtype, else the root's, else float32.

    An unrecognised config value falls back to float32, as SGLang does (with a warning).
    """
    text_config = hf_config.get("text_config")
    value: Any = None
    if isinstance(text_config, dict) and "mamba_ssm_dtype" in text_config:
        value = text_config["mamba_ssm_dtype"]
    elif "mamba_ssm_dtype" in hf_config:
        value = hf_config["mamba_ssm_dtype"]
    if isinstance(value, str) and value in _STATE_DTYPE_BYTES:
        return value
    return DEFAULT_SSM_DTYPE


def _kv_cache_quantized_fp8(hf_config: Mapping[str, Any]) -> bool:
    """`--kv-cache-dtype auto` picks FP8 when the checkpoint's quant config says kv_cache_quant_algo FP8."""
    quant = hf_config.get("quantization_config")
    if not isinstance(quant, dict):
        return False
    algo = quant.get("kv_cache_quant_algo")
    nested = quant.get("quantization")
    if algo is None and isinstance(nested, dict):
        algo = nested.get("kv_cache_quant_algo")
    return isinstance(algo, str) and algo.upper() == "FP8"


def _kv_dtype_bytes(hf_config: Mapping[str, Any], kv_dtype: str) -> int:
    """Bytes per KV element for `--kv-cache-dtype` (auto = the model dtype, 16-bit for every checkpoint dtype).

    SGLang serves a float32 checkpoint in float16 under --dtype auto (`_get_and_verify_dtype`), so
    auto is 2 bytes unless the quant config asks for an FP8 KV cache.
    """
    name = kv_dtype.lower()
    if name == "auto":
        return 1 if _kv_cache_quantized_fp8(hf_config) else 2
    if name not in _KV_DTYPE_BYTES:
        raise InputError(
            f"kv dtype must be one of auto, bf16, bfloat16, fp8_e4m3, fp8_e5m2; got {kv_dtype!r}"
        )
    return _KV_DTYPE_BYTES[name]


# --- KV bytes per token ---------------------------------------------------------------------------


def _gqa_kv_elements_per_layer(fields: _Fields, tp_size: int, dcp_size: int = 1) -> int:
    """`ModelConfig.get_num_kv_heads(tp, dcp)` (configs/model_config.py:1700-1711): DCP ranks replicate KV,
    so heads split across `tp // dcp` groups, at least one per rank."""
    total_kv_heads: int | None = None
    for name in ("n_head_kv", "num_kv_heads", "num_key_value_heads"):
        if fields.has(name):
            total_kv_heads = fields.positive_int(name)
            break
    if total_kv_heads is None:
        if not fields.has("num_attention_heads"):
            raise InputError(
                f"config field '{fields.prefix}num_key_value_heads' (or 'num_attention_heads') is missing "
                f"(needed for {fields.architecture})"
            )
        total_kv_heads = fields.positive_int("num_attention_heads")
    kv_heads_per_rank = max(1, total_kv_heads // (tp_size // dcp_size))
    if fields.has("head_dim"):
        head_dim = fields.positive_int("head_dim")
    else:
        head_dim = fields.positive_int("hidden_size") // fields.positive_int("num_attention_heads")
    value = fields.data.get("v_head_dim")
    v_head_dim = fields.positive_int("v_head_dim") if value else head_dim
    return kv_heads_per_rank * (head_dim + v_head_dim)


def _mla_kv_elements_per_layer(fields: _Fields) -> int:
    """`calculate_mla_kv_cache_dim` for non-DSA MLA: one latent of kv_lora_rank + qk_rope_head_dim, not TP-split."""
    return fields.positive_int("kv_lora_rank") + fields.positive_int("qk_rope_head_dim")


# --- pipeline parallelism --------------------------------------------------------------------------


def pp_stage_bounds(num_layers: int, pp_size: int, partition: list[int] | None = None) -> list[tuple[int, int]]:
    """[start, end) of every stage's layers: `distributed/utils.py` `get_pp_indices` (lines 110-150); the
    last `num_layers % pp_size` stages get one more layer, or `SGLANG_PP_LAYER_PARTITION` as `partition`."""
    if pp_size < 1:
        raise InputError(f"pp_size must be >= 1, got {pp_size}")
    if partition is not None and pp_size > 1:
        if len(partition) != pp_size or sum(partition) != num_layers:
            raise InputError(
                f"SGLANG_PP_LAYER_PARTITION {partition} must have {pp_size} entries summing to {num_layers} layers"
            )
        starts = [sum(partition[:rank]) for rank in range(pp_size)]
        return [(start, start + size) for start, size in zip(starts, partition, strict=True)]
    base, remainder = divmod(num_layers, pp_size)
    bounds = []
    for rank in range(pp_size):
        if rank >= pp_size - remainder:
            start = rank * (base + 1) - (pp_size - remainder)
            bounds.append((start, start + base + 1))
        else:
            bounds.append((rank * base, rank * base + base))
    return bounds


def largest_stage_count(layer_ids: tuple[int, ...], bounds: list[tuple[int, int]]) -> int:
    """How many of `layer_ids` the fullest stage holds."""
    return max((sum(1 for layer in layer_ids if start <= layer < end) for start, end in bounds), default=0)


def pp_charged_share(
    linear_ids: tuple[int, ...], num_layers: int, pp_size: int, partition: list[int] | None = None
) -> float:
    """The share of the state bytes every PP stage is charged: the largest stage's layers over all state
    layers (kv_cache_configurator.py `_handle_max_mamba_cache`, `pp_layer_scale`), 1.0 without PP."""
    if pp_size <= 1 or not linear_ids:
        return 1.0
    return largest_stage_count(linear_ids, pp_stage_bounds(num_layers, pp_size, partition)) / len(linear_ids)


# --- the entry point ------------------------------------------------------------------------------


def model_bytes(
    hf_config: Mapping[str, Any],
    *,
    tp_size: int = 1,
    ssm_dtype: str | None = None,
    conv_dtype: str = "bfloat16",
    kv_dtype: str = "auto",
    dcp_size: int = 1,
    pp_size: int = 1,
    pp_partition: list[int] | None = None,
) -> ModelBytes:
    """The per-GPU state and KV byte constants SGLang 0.5.23 would size its pools with.

    `tp_size` is the attention-TP width (tp_size, or tp_size / dp_size under DP attention).
    `dcp_size` (--dcp-size) gives the physical KV row of a DCP rank: GQA heads split across tp // dcp
    (MLA's latent is not head-split). `pp_size` charges the largest stage's share of the state
    (`pp_partition` is SGLANG_PP_LAYER_PARTITION) and the KV of the stage with the most attention layers
    (the one whose token count the PP all-reduce MIN keeps, at equal memory per stage). `ssm_dtype` None follows SGLang's precedence
    (config mamba_ssm_dtype for the models whose SGLang config reads it, else float32); a value
    acts like `--mamba-ssm-dtype`, which overrides for every family. `conv_dtype` is
    `SGLANG_MAMBA_CONV_DTYPE`; `kv_dtype` is `--kv-cache-dtype`.
    """
    if not isinstance(hf_config, Mapping):
        raise InputError(f"the model config must be a JSON object, got {type(hf_config).__name__}")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size <= 0:
        raise InputError(f"tp_size must be a positive integer, got {tp_size!r}")
    for name, value in (("dcp_size", dcp_size), ("pp_size", pp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if tp_size % dcp_size != 0:
        raise InputError(f"tp_size {tp_size} is not divisible by dcp_size {dcp_size}; SGLang cannot form the DCP groups")
    architecture = _architecture_of(hf_config)
    if architecture not in _ARCHITECTURES:
        raise InputError(
            f"unsupported architecture {architecture!r}: not a hybrid model this advisor sizes "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    reader, nested = _ARCHITECTURES[architecture]
    fields = _Fields(hf_config, architecture)
    if nested:
        fields = fields.sub(nested)
    layout = reader(fields, tp_size)

    conv_name = _state_dtype_name(conv_dtype, "conv dtype")
    if ssm_dtype is not None:
        ssm_name = _state_dtype_name(ssm_dtype, "ssm dtype")
    elif layout.reads_config_ssm_dtype:
        ssm_name = _config_ssm_dtype(fields.data if nested else hf_config)
    else:
        ssm_name = DEFAULT_SSM_DTYPE
    kv_element_bytes = _kv_dtype_bytes(hf_config, kv_dtype)

    if layout.attention_layers == 0 or layout.attention is None:
        kv_elements_per_layer = 0
    elif layout.mla:
        kv_elements_per_layer = _mla_kv_elements_per_layer(layout.attention)
    else:
        kv_elements_per_layer = _gqa_kv_elements_per_layer(layout.attention, tp_size, dcp_size)
    attention_layers = layout.attention_layers
    state_share = 1.0
    if pp_size > 1:
        bounds = pp_stage_bounds(layout.num_layers, pp_size, pp_partition)
        attention_layers = largest_stage_count(layout.attention_ids, bounds)
        state_share = pp_charged_share(layout.linear_ids, layout.num_layers, pp_size, pp_partition)

    return ModelBytes(
        family=layout.family,
        architecture=architecture,
        num_linear_layers=layout.linear_layers,
        num_attention_layers=layout.attention_layers,
        conv_bytes_per_slot=layout.shape.conv_elements * _STATE_DTYPE_BYTES[conv_name] * layout.linear_layers,
        ssm_bytes_per_slot=layout.shape.ssm_elements * _STATE_DTYPE_BYTES[ssm_name] * layout.linear_layers,
        kv_bytes_per_token=kv_elements_per_layer * attention_layers * kv_element_bytes,
        ssm_dtype=ssm_name,
        conv_dtype=conv_name,
        kv_dtype_bytes=kv_element_bytes,
        dcp_size=dcp_size,
        pp_size=pp_size,
        pp_state_share=state_share,
        kv_row_attention_layers=attention_layers,
    )


def eagle_draft_kv_bytes_per_token(model: ModelBytes, draft_layers: int) -> int:
    """Draft KV bytes SGLang adds to the per-row cell under EAGLE/MTP/STANDALONE:
    `int(cell * draft_layers / layers)` (model_executor/pool_configurator.py `DefaultPoolConfigurator.__init__`,
    which assumes the draft reuses the target's per-layer KV size). `draft_layers` is the draft's
    num_nextn_predict_layers (or its layer count with a separate draft model)."""
    if draft_layers < 0:
        raise InputError(f"draft_layers must be >= 0, got {draft_layers}")
    layers = model.kv_row_attention_layers if model.kv_row_attention_layers is not None else model.num_attention_layers
    if layers == 0:
        return 0
    return int(model.kv_bytes_per_token * draft_layers / layers)


# SGLang 0.5.23's default `--linear-replayssm-cache-len` (arg_groups/fields/exec_.py:582-585).
DEFAULT_REPLAYSSM_CACHE_LEN = 16


def replayssm_ring_bytes_per_request(
    hf_config: Mapping[str, Any],
    *,
    tp_size: int = 1,
    record_len: int = DEFAULT_REPLAYSSM_CACHE_LEN,
    conv_dtype: str = "bfloat16",
) -> int:
    """ReplaySSM spec-verify ring bytes of one request over all GDN/KDA layers on one GPU:
    `BaseLinearStateParams.replayssm_ring_bytes_per_req` (configs/mamba_utils.py:127-157). `record_len` is
    `--linear-replayssm-cache-len`, the length `_handle_max_mamba_cache` sizes with; `conv_dtype` is
    SGLANG_MAMBA_CONV_DTYPE. Other families have no ring (InputError)."""
    if record_len < 1:
        raise InputError(f"record_len (--linear-replayssm-cache-len) must be >= 1, got {record_len}")
    architecture = _architecture_of(hf_config)
    entry = _ARCHITECTURES.get(architecture)
    family = linear_family_of(architecture)
    if entry is None or family not in ("gdn", "kda"):
        raise InputError(f"{architecture}: ReplaySSM rings exist only for GDN and KDA models")
    reader, nested = entry
    fields = _Fields(hf_config, architecture)
    if nested:
        fields = fields.sub(nested)
    layers = reader(fields, tp_size).linear_layers
    conv_b = _STATE_DTYPE_BYTES[_state_dtype_name(conv_dtype, "conv dtype")]
    fp32_b = 4
    if family == "kda":
        linear = fields.sub("linear_attn_config")
        heads = linear.positive_int("num_heads")
        hv = _divide(heads, tp_size, "KDA heads", architecture)
        h_k = -(-heads // tp_size)  # num_k_heads defaults to num_heads
        v_dim = k_dim = linear.positive_int("head_dim")
        per_layer = (
            hv * record_len * v_dim * conv_b  # raw v
            + h_k * record_len * k_dim * conv_b  # raw k
            + hv * record_len * fp32_b  # beta
            + hv * record_len * k_dim * fp32_b  # vector g
            + hv * record_len * v_dim * conv_b  # d
            + h_k * record_len * k_dim * conv_b  # k
        )
    else:
        hv = _divide(fields.positive_int("linear_num_value_heads"), tp_size, "SSM heads", architecture)
        h_k = -(-fields.positive_int("linear_num_key_heads") // tp_size)
        v_dim = fields.positive_int("linear_value_head_dim")
        k_dim = fields.positive_int("linear_key_head_dim")
        per_layer = (
            hv * record_len * v_dim * conv_b  # d
            + h_k * record_len * k_dim * conv_b  # normalized k
            + hv * record_len * fp32_b  # scalar g
        )
        if conv_b != fp32_b:  # low parts of the activation-dtype d/k rings
            per_layer += hv * record_len * v_dim * conv_b + h_k * record_len * k_dim * conv_b
    return per_layer * layers


def dcp_kv_gain(
    hf_config: Mapping[str, Any], *, tp_size: int, dcp_size: int, kv_dtype: str = "auto"
) -> float:
    """How much cheaper a logical token's KV is under DCP than without it, at the same tp_size:
    `dcp * kv_row(tp) / kv_row(tp, dcp)`, i.e. `dcp * heads(tp) / heads(tp // dcp)` for GQA (DCP ranks
    replicate heads, configs/model_config.py:1700-1711) and `dcp` for MLA. Not `dcp` when KV heads are few."""
    plain = model_bytes(hf_config, tp_size=tp_size, kv_dtype=kv_dtype)
    sharded = model_bytes(hf_config, tp_size=tp_size, kv_dtype=kv_dtype, dcp_size=dcp_size)
    if sharded.kv_bytes_per_token == 0:
        raise InputError(f"{plain.architecture} has no full-attention layers, so DCP has no KV to shard")
    return dcp_size * plain.kv_bytes_per_token / sharded.kv_bytes_per_token
