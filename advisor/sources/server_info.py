"""Fetch and read SGLang's `/server_info` (the serving config and per-DP-shard pool sizes).

Field names follow SGLang 0.5.23 (`entrypoints/http_server.py`, `managers/scheduler_components/
internal_state.py`) with fallbacks for older releases: `/get_server_info`
before 0.5.10, `mamba_scheduler_strategy` before 0.5.16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from advisor.errors import InputError
from advisor.model.serving import (
    SKIP_SOURCE_ASSUMED,
    SKIP_SOURCE_ENV_VARS,
    STRATEGIES,
    ConfigError,
    ServingConfig,
    extra_buffer_capable,
)
from advisor.model.state_shapes import linear_family_of
from advisor.sources.http import FetchResult, HttpClient

# SGLang 0.5.23 arg_groups/fields/exec_.py: ReplaySSM spec-verify moves the D intermediate states off the
# per-request slot budget (the seed's caveat: D = 0). `enable_linear_replayssm` (decode only) does not.
REPLAYSSM_SPEC_FIELD = "enable_linear_replayssm_spec"
SKIP_DECODE_LOCK_ENV = "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"


@dataclass(frozen=True)
class ServerShard:
    """One DP shard's computed pool sizes, from `internal_states[i]` (these differ from the user flags).

    `kv_capacity_tokens` is SGLang's `token_capacity`, which is logical under DCP (physical rows x dcp:
    managers/tp_worker.py `get_worker_info` returns `logical_max_total_num_tokens`); bytes per token
    must divide `kv_cache_gb` by `kv_capacity_physical_tokens` instead.
    """

    dp_rank: int
    max_mamba_cache_size: int | None
    effective_max_running_requests: int | None
    kv_capacity_tokens: int | None
    kv_cache_gb: float | None
    weight_gb: float | None
    startup_available_gb: float | None
    kv_capacity_physical_tokens: int | None = None
    graph_gb: float | None = None  # sum over capture phases of `memory_usage.graph`


@dataclass(frozen=True)
class ServerInfo:
    serving: ServingConfig
    version: str | None
    model_name: str | None
    shards: list[ServerShard]
    # --decode-log-interval: decode steps between two `Decode batch` lines (SGLang's default 40), when shown
    decode_log_interval: int | None = None
    # The admission knobs the replay's scheduler model needs, when shown (/server_info dumps every server arg):
    # where a long prompt is cut (0: chunking off), the tokens one prefill batch takes, the new-token-ratio scale.
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    schedule_conservativeness: float | None = None


def _join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def fetch_server_info(client: HttpClient, base_url: str) -> FetchResult:
    """GET `/server_info`, or the pre-0.5.10 `/get_server_info` when the first answers 404."""
    result = client.get_json(_join(base_url, "/server_info"))
    if result.status == 404:
        return client.get_json(_join(base_url, "/get_server_info"))
    return result


def _int(body: dict[str, Any], name: str, *, where: str = "server_info") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise InputError(f"{where}: {name}={value!r} is not an integer")
    return int(value)


def _int_or(body: dict[str, Any], name: str, default: int, *, where: str = "server_info") -> int:
    value = _int(body, name, where=where)
    return default if value is None else value


def _float(
    body: dict[str, Any], name: str, default: float | None = None, *, where: str = "server_info"
) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {name}={value!r} is not a number")
    return float(value)


def _bool(body: dict[str, Any], name: str, *, where: str = "server_info") -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InputError(f"{where}: {name}={value!r} is not a boolean")
    return value


def _str(body: dict[str, Any], name: str, *, where: str = "server_info") -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: {name}={value!r} is not a string")
    return value


def _truthy_env(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def serving_config_from_args(
    body: dict[str, Any], *, env_vars: Any = None, where: str = "server_info", architecture: str | None = None
) -> ServingConfig:
    """SGLang's server-args fields (a `/server_info` body, or a boot log's `server_args=` line) as a
    ServingConfig; absent fields take SGLang's defaults. Accepts the pre-0.5.16 strategy field name.

    `env_vars` is `internal_states[0].env_vars`, present only under SGLANG_EXPOSE_OWN_ENV_VARS=1: when
    absent the decode-lock skip is marked "assumed". `architecture` (the HF config's architectures[0],
    when the caller knows it) decides extra-buffer capability and the linear-attention family."""
    strategy_field = (
        "mamba_radix_cache_strategy" if "mamba_radix_cache_strategy" in body else "mamba_scheduler_strategy"
    )
    strategy = _str(body, strategy_field, where=where) or "auto"
    if strategy not in STRATEGIES:
        raise InputError(f"{where}: unknown {strategy_field} {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    skip_decode_lock = isinstance(env_vars, dict) and _truthy_env(env_vars.get(SKIP_DECODE_LOCK_ENV, ""))
    skip_source = SKIP_SOURCE_ENV_VARS if isinstance(env_vars, dict) else SKIP_SOURCE_ASSUMED
    backend = _str(body, "linear_attn_backend", where=where)
    try:
        return ServingConfig(
            strategy=strategy,
            disable_radix_cache=_bool(body, "disable_radix_cache", where=where),
            disable_overlap_schedule=_bool(body, "disable_overlap_schedule", where=where),
            pp_size=_int_or(body, "pp_size", 1, where=where),
            tp_size=_int_or(body, "tp_size", 1, where=where),
            dp_size=_int_or(body, "dp_size", 1, where=where),
            attn_dp_size=_int_or(body, "attn_dp_size", 1, where=where),
            dcp_size=_int_or(body, "dcp_size", 1, where=where),
            page_size=_int_or(body, "page_size", 1, where=where),
            skip_decode_lock=skip_decode_lock,
            skip_decode_lock_source=skip_source,
            speculative_algorithm=_str(body, "speculative_algorithm", where=where),
            draft_tokens=_int_or(body, "speculative_num_draft_tokens", 0, where=where),
            replayssm=_bool(body, REPLAYSSM_SPEC_FIELD, where=where),
            mamba_full_memory_ratio=_float(body, "mamba_full_memory_ratio", 0.9, where=where) or 0.9,
            max_mamba_cache_size=_int(body, "max_mamba_cache_size", where=where),
            max_running_requests=_int(body, "max_running_requests", where=where),
            mem_fraction_static=_float(body, "mem_fraction_static", where=where),
            kv_cache_dtype=_str(body, "kv_cache_dtype", where=where) or "auto",
            mamba_ssm_dtype=_str(body, "mamba_ssm_dtype", where=where),
            unified_memory=_bool(body, "enable_unified_memory", where=where),
            supports_extra_buffer=extra_buffer_capable(architecture, backend),
            linear_family=linear_family_of(architecture) if architecture else None,
            disaggregation_mode=_str(body, "disaggregation_mode", where=where) or "null",
        )
    except ConfigError as exc:
        raise InputError(f"{where}: {exc}") from None


def _graph_gb(memory: dict[str, Any], where: str) -> float | None:
    graph = memory.get("graph")
    if graph is None:
        return None
    if not isinstance(graph, dict):
        raise InputError(f"{where}.graph is not an object")
    total = 0.0
    for phase in graph:
        total += _float(graph, phase, 0.0, where=f"{where}.graph") or 0.0
    return total


def _shard(index: int, entry: Any, dcp_size: int = 1) -> ServerShard:
    where = f"server_info internal_states[{index}]"
    if not isinstance(entry, dict):
        raise InputError(f"{where} is not an object")
    memory = entry.get("memory_usage")
    if memory is None:
        memory = {}
    if not isinstance(memory, dict):
        raise InputError(f"{where}.memory_usage is not an object")
    memory_where = f"{where}.memory_usage"
    logical_tokens = _int(memory, "token_capacity", where=memory_where)
    return ServerShard(
        dp_rank=_int_or(entry, "dp_rank", index, where=where),
        max_mamba_cache_size=_int(entry, "max_mamba_cache_size", where=where),
        effective_max_running_requests=_int(entry, "effective_max_running_requests_per_dp", where=where),
        kv_capacity_tokens=logical_tokens,
        kv_cache_gb=_float(memory, "kvcache", where=memory_where),
        weight_gb=_float(memory, "weight", where=memory_where),
        startup_available_gb=_float(memory, "startup_available", where=memory_where),
        kv_capacity_physical_tokens=None if logical_tokens is None else logical_tokens // dcp_size,
        graph_gb=_graph_gb(memory, memory_where),
    )


def parse_server_info(body: dict[str, Any], *, architecture: str | None = None) -> ServerInfo:
    """Turn a `/server_info` body into the serving config and the per-shard pool sizes.

    `architecture` (HF architectures[0], when known from the model's config) refines strategy `auto`."""
    if not isinstance(body, dict):
        raise InputError(f"server_info: expected a JSON object, got {type(body).__name__}")
    states = body.get("internal_states")
    if states is None:
        states = []
    if not isinstance(states, list):
        raise InputError("server_info: internal_states is not a list")
    first_shard = states[0] if states and isinstance(states[0], dict) else None
    serving = serving_config_from_args(body, env_vars=(first_shard or {}).get("env_vars"), architecture=architecture)
    shards = [_shard(index, entry, serving.dcp_size) for index, entry in enumerate(states)]
    model_name = _str(body, "served_model_name") or _str(body, "model_path")
    version = body.get("version")
    interval = _int(body, "decode_log_interval")
    chunk = _int(body, "chunked_prefill_size")  # -1 turns chunking off
    max_prefill = _int(body, "max_prefill_tokens")
    conservativeness = _float(body, "schedule_conservativeness")
    return ServerInfo(
        serving=serving,
        version=str(version) if version is not None else None,
        model_name=model_name,
        shards=shards,
        decode_log_interval=interval if interval is not None and interval >= 1 else None,
        chunked_prefill_size=None if chunk is None else max(chunk, 0),  # 0: chunking off
        max_prefill_tokens=max_prefill if max_prefill is not None and max_prefill >= 1 else None,
        schedule_conservativeness=(conservativeness if conservativeness is not None and math.isfinite(conservativeness)
                                   and conservativeness > 0 else None),
    )
