"""The simulated server: a serving config, the two per-GPU byte constants, `rest`, the scheduler knobs
and the step-time cost model, loaded from YAML (`advisor/data/servers/<name>.yaml` or any file).

`SchedulerServerConfig.split()` sizes the pools with `advisor.model.pools.split_pools`, exactly as SGLang.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.model.pools import ByteConstants
from advisor.model.serving import ConfigError, ServingConfig
from advisor.scheduler.costmodel import cost_model_from_dict
from advisor.scheduler.server import SchedulerServerConfig
from advisor.sources.local_files import read_local_bytes
from advisor.yaml_loading import load_yaml

MAX_SIM_CONFIG_BYTES = 256 << 10  # as the daemon config: PyYAML needs ~70x the text in memory

SERVERS_DIR = Path(__file__).resolve().parent.parent / "data" / "servers"
DEFAULT_SERVER = "default"

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_BYTES_RE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*(?:/\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*)?$"
)


def parse_bytes(value: Any, where: str) -> float:
    """A byte count: a number, or "<n> <unit>[ / <divisor>]" with unit B, KiB, MiB, GiB or TiB.

    "13.50 GiB / 258" is one state slot of a boot log whose state tensors are 13.50 GiB for
    258 slots. Decimal units (GB) are refused: SGLang's logs print GB but mean GiB.
    """
    if isinstance(value, bool):
        raise InputError(f"{where} must be a byte count, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _BYTES_RE.match(value)
        if not match:
            raise InputError(f"{where} must be a byte count like '13.5 GiB / 258', got {value!r}")
        amount, unit, divisor = match.groups()
        unit_key = (unit or "b").lower()
        if unit_key not in _UNITS:
            hint = " (SGLang's 'GB' are GiB: write GiB)" if unit_key in ("gb", "mb", "kb", "tb") else ""
            raise InputError(f"{where}: unknown unit {unit!r}{hint}; use B, KiB, MiB, GiB or TiB")
        number = float(amount) * _UNITS[unit_key]
        if divisor is not None:
            if float(divisor) <= 0:
                raise InputError(f"{where}: divisor must be > 0, got {divisor}")
            number /= float(divisor)
    else:
        raise InputError(f"{where} must be a byte count, got {type(value).__name__}")
    if not math.isfinite(number) or number <= 0:
        raise InputError(f"{where} must be > 0 bytes, got {value!r}")
    return number


def _expect_int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _expect_float(value: Any, where: str, minimum: float = 0.0, strict: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where} must be a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise InputError(f"{where} must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def _expect_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where} must be true or false, got {value!r}")
    return value


_SERVING_FIELDS = {item.name: item for item in fields(ServingConfig) if item.name != "extras"}


def _serving_from_dict(data: Any) -> ServingConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"serving must be a mapping of SGLang flags, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "speculative_num_draft_tokens":
            name = "draft_tokens"
        if name == "mamba_radix_cache_strategy":
            name = "strategy"
        if name not in _SERVING_FIELDS:
            raise InputError(f"serving.{key} is not a known serving setting")
        values[name] = value
    for name, value in values.items():
        default = _SERVING_FIELDS[name].default
        where = f"serving.{name}"
        if isinstance(default, bool):
            _expect_bool(value, where)
        elif isinstance(default, int) and not isinstance(default, bool):
            _expect_int(value, where, minimum=0)
        elif isinstance(default, float):
            values[name] = _expect_float(value, where)
        elif name in ("max_mamba_cache_size", "max_running_requests"):
            if value is not None:
                _expect_int(value, where)
        elif name == "mem_fraction_static":
            if value is not None:
                values[name] = _expect_float(value, where)
        elif value is not None and not isinstance(value, str):
            raise InputError(f"{where} must be a string, got {value!r}")
    try:
        return ServingConfig(**values)
    except (ConfigError, TypeError) as exc:
        raise InputError(f"serving: {exc}") from None


_TOP_LEVEL = {
    "name",
    "description",
    "model_name",
    "version",
    "model_context_len",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "decode_log_interval",
    "schedule_conservativeness",
    "enable_radix_prefix_reuse",
    "retract_to_front",
    "serving",
    "constants",
    "rest_bytes",
    "replayssm_fixed_bytes",
    "cost",
}


def server_config_from_dict(d: dict) -> SchedulerServerConfig:
    """Build a SchedulerServerConfig from a plain mapping (a parsed YAML file). Errors name the field."""
    if not isinstance(d, dict):
        raise InputError(f"a server config must be a mapping, got {type(d).__name__}")
    for key in d:
        if key not in _TOP_LEVEL:
            raise InputError(f"{key} is not a server-config field (known: {', '.join(sorted(_TOP_LEVEL))})")
    for required in ("constants", "rest_bytes"):
        if required not in d:
            raise InputError(f"{required} is required in a server config")
    constants_raw = d["constants"]
    if not isinstance(constants_raw, dict):
        raise InputError("constants must be a mapping with state_bytes_per_slot and kv_bytes_per_token")
    for key in constants_raw:
        if key not in ("state_bytes_per_slot", "kv_bytes_per_token", "draft_kv_bytes_per_token"):
            raise InputError(f"constants.{key} is not a byte constant")
    for required in ("state_bytes_per_slot", "kv_bytes_per_token"):
        if required not in constants_raw:
            raise InputError(f"constants.{required} is required")
    draft_raw = constants_raw.get("draft_kv_bytes_per_token", 0)
    constants = ByteConstants(
        state_bytes_per_slot=parse_bytes(
            constants_raw["state_bytes_per_slot"], "constants.state_bytes_per_slot"
        ),
        kv_bytes_per_token=parse_bytes(constants_raw["kv_bytes_per_token"], "constants.kv_bytes_per_token"),
        draft_kv_bytes_per_token=0.0
        if draft_raw in (0, None)
        else parse_bytes(draft_raw, "constants.draft_kv_bytes_per_token"),
    )
    kwargs: dict[str, Any] = {
        "serving": _serving_from_dict(d.get("serving")),
        "constants": constants,
        "rest_bytes": parse_bytes(d["rest_bytes"], "rest_bytes"),
    }
    for key in ("model_name", "version", "name"):
        if key in d:
            if not isinstance(d[key], (str, int, float)) or isinstance(d[key], bool):
                raise InputError(f"{key} must be a string, got {d[key]!r}")
            kwargs[key] = str(d[key])
    for key in ("model_context_len", "chunked_prefill_size", "max_prefill_tokens", "decode_log_interval"):
        if key in d:
            kwargs[key] = _expect_int(d[key], key)
    if "schedule_conservativeness" in d:
        kwargs["schedule_conservativeness"] = _expect_float(
            d["schedule_conservativeness"], "schedule_conservativeness"
        )
    for key in ("enable_radix_prefix_reuse", "retract_to_front"):
        if key in d:
            kwargs[key] = _expect_bool(d[key], key)
    if "replayssm_fixed_bytes" in d:
        raw = d["replayssm_fixed_bytes"]
        kwargs["replayssm_fixed_bytes"] = (
            0.0 if raw in (0, None) else parse_bytes(raw, "replayssm_fixed_bytes")
        )
    if d.get("cost") is not None:
        kwargs["cost"] = cost_model_from_dict(d["cost"])
    config = SchedulerServerConfig(**kwargs)
    try:
        split = config.split()
    except ValueError as exc:
        raise InputError(f"server config cannot be sized: {exc}") from None
    if split.max_running_requests < 1 or split.kv_capacity_tokens < 1:
        raise InputError(
            f"server config sizes an unusable pool (max_running_requests={split.max_running_requests}, "
            f"kv_capacity_tokens={split.kv_capacity_tokens}); check rest_bytes and the ratio"
        )
    return config


def available_server_configs() -> list[str]:
    return sorted(path.stem for path in SERVERS_DIR.glob("*.yaml"))


def resolve_server_path(path_or_name: str) -> Path:
    """A file path as given, or the shipped config of that name."""
    candidate = Path(path_or_name)
    if candidate.is_file():
        return candidate
    if "/" not in path_or_name and not path_or_name.endswith((".yaml", ".yml")):
        shipped = SERVERS_DIR / f"{path_or_name}.yaml"
        if shipped.is_file():
            return shipped
    raise InputError(
        f"server config {path_or_name!r} is neither a file nor a shipped config "
        f"({', '.join(available_server_configs())})"
    )


def load_server_config(path: str | None) -> SchedulerServerConfig:
    """Load a server config from a YAML file or a shipped name; None gives the shipped default."""
    resolved = resolve_server_path(path if path is not None else DEFAULT_SERVER)
    raw = read_local_bytes(resolved, "server config", MAX_SIM_CONFIG_BYTES)  # never a FIFO or a device
    data = load_yaml(raw, f"server config {resolved}", MAX_SIM_CONFIG_BYTES)  # no aliases: no YAML bomb
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": resolved.stem}
    try:
        return server_config_from_dict(data)
    except InputError as exc:
        raise InputError(f"server config {resolved.name}: {exc}") from None
