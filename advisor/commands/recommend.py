"""`pool-advisor recommend`: the seed's one-shot computation from a boot log, byte figures or a model's
config.json, printed as a short report ending in the flag line (or `--json`)."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from typing import Any

from advisor.commands import recommend_store
from advisor.errors import InputError
from advisor.json_output import finite_or_none
from advisor.model.advice import MemoryFacts, advise, clamp_mismatch
from advisor.model.pools import GIB, ByteConstants, kv_capacity_requests, split_pools
from advisor.model.serving import (
    STRATEGIES,
    ServingConfig,
    extra_buffer_capable,
    replayssm_active,
    slots_per_request,
    spec_enabled,
)
from advisor.model.state_shapes import (
    eagle_draft_kv_bytes_per_token,
    linear_family_of,
    model_bytes,
    replayssm_ring_bytes_per_request,
)
from advisor.sources.bootlog import BootInfo, read_boot_log
from advisor.sources.hf_config import load_hf_config
from advisor.validate import BOUNDS, check_in_bound


def register(sub: Any) -> None:
    p = sub.add_parser("recommend", help="one-shot, offline: the optimal --mamba-full-memory-ratio for a context length")
    src = p.add_argument_group("byte constants (one of)")
    src.add_argument("--boot-log", metavar="FILE", help="an SGLang boot log (any ratio) of this model and dtypes")
    src.add_argument("--state-bytes-per-slot", type=float, metavar="BYTES")
    src.add_argument("--kv-bytes-per-token", type=float, metavar="BYTES")
    src.add_argument("--model-config", metavar="CONFIG_JSON", help="the model's HF config.json (derive the bytes)")
    src.add_argument("--tp-size", type=int, help="tensor-parallel size (for --model-config)")
    src.add_argument("--ssm-dtype", choices=("float32", "bfloat16", "float16"), help="--mamba-ssm-dtype")
    src.add_argument("--kv-dtype", help="--kv-cache-dtype (auto, bf16, fp8_e4m3, fp8_e5m2)")
    p.add_argument("--context-length", "-L", type=float, metavar="L", help="mean context per request (input + output tokens); required without --prometheus-url")
    p.add_argument("--strategy", choices=STRATEGIES, help="--mamba-radix-cache-strategy (default: from the boot log, else auto)")
    p.add_argument("--disable-radix-cache", action="store_true", default=None)
    p.add_argument("--disable-overlap-schedule", action="store_true", default=None)
    p.add_argument("--pp-size", type=int)
    p.add_argument("--skip-decode-lock", action="store_true", default=None, help="SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1")
    p.add_argument("--draft-tokens", type=int, metavar="D", help="--speculative-num-draft-tokens")
    p.add_argument("--replayssm", action="store_true", default=None, help="ReplaySSM spec-verify is on (D counts as 0)")
    p.add_argument("--dcp-size", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--rest-gib", type=float, help="per-GPU GiB for both pools (else from the boot log)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    recommend_store.add_arguments(p)
    p.set_defaults(handler=run)


# r* outside this range says the inputs are inconsistent (advisor.validate: SGLang's examples sit within 0.1..10).
RATIO_LOW, RATIO_HIGH = BOUNDS["ratio"].low, BOUNDS["ratio"].high
# Every numeric flag (its attribute, named as the config field it matches in advisor.validate.BOUNDS) -> the flag.
_FLAGS = ("context_length", "state_bytes_per_slot", "kv_bytes_per_token", "rest_gib", "tp_size", "pp_size",
          "dcp_size", "page_size", "draft_tokens")


def check_ranges(args: argparse.Namespace) -> None:
    """Every numeric flag given is finite and within its bound (a message naming the flag otherwise)."""
    for attribute in _FLAGS:
        value = getattr(args, attribute, None)
        if value is not None:
            check_in_bound(float(value), "--" + attribute.replace("_", "-"), BOUNDS[attribute])


def _check_boot(boot: BootInfo, constants: ByteConstants, rest: float | None) -> None:
    """What a boot log gave is as plausible as what a flag may give (a garbled log must not become advice)."""
    check_in_bound(constants.state_bytes_per_slot, "the boot log's state bytes per slot", BOUNDS["state_bytes_per_slot"])
    check_in_bound(constants.kv_bytes_per_token, "the boot log's KV bytes per token", BOUNDS["kv_bytes_per_token"])
    if rest is not None:
        check_in_bound(rest / GIB, "the boot log's pool budget (rest)", BOUNDS["rest_gib"])
    mfs = boot.server_args.get("mem_fraction_static") if isinstance(boot.server_args, dict) else None
    if isinstance(mfs, (int, float)) and not isinstance(mfs, bool):
        check_in_bound(float(mfs), "the boot log's mem_fraction_static", BOUNDS["mem_fraction_static"])


def _boot_config(boot: BootInfo | None) -> ServingConfig:
    """The serving config a boot log's `server_args=` line records (SGLang's defaults where it is silent; the
    model class and the capped warning's S refine it: `BootInfo.serving_config`)."""
    if boot is None:
        return ServingConfig()
    return boot.serving_config()


def _serving_config(args: argparse.Namespace, boot: BootInfo | None, hf: dict[str, Any] | None) -> ServingConfig:
    base = _boot_config(boot)
    overrides = {
        "strategy": args.strategy,
        "disable_radix_cache": args.disable_radix_cache,
        "disable_overlap_schedule": args.disable_overlap_schedule,
        "pp_size": args.pp_size,
        "draft_tokens": args.draft_tokens,
        "replayssm": args.replayssm,
        "dcp_size": args.dcp_size,
        "page_size": args.page_size,
        "tp_size": args.tp_size,
        "kv_cache_dtype": args.kv_dtype,
        "mamba_ssm_dtype": args.ssm_dtype,
    }
    fields = {k: v for k, v in overrides.items() if v is not None}
    if fields.get("draft_tokens") and not (base.speculative_algorithm or fields.get("speculative_algorithm")):
        fields["speculative_algorithm"] = "EAGLE"
    config = replace(base, **fields)
    if args.skip_decode_lock is not None:
        config = config.with_skip_decode_lock(args.skip_decode_lock)  # said by the operator, not assumed
    if hf is not None:
        config = _with_architecture(config, hf)
    return config


def _with_architecture(config: ServingConfig, hf: dict[str, Any]) -> ServingConfig:
    """What the model's architecture decides: whether `auto` may pick extra_buffer (LFM2 may not) and the
    linear-attention family (ReplaySSM acts on GDN/KDA only)."""
    architectures = hf.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures and isinstance(architectures[0], str) else None
    if architecture is None:
        return config
    return replace(
        config,
        supports_extra_buffer=config.supports_extra_buffer and extra_buffer_capable(architecture),
        linear_family=config.linear_family or linear_family_of(architecture),
    )


def _constants(
    args: argparse.Namespace, boot: BootInfo | None, config: ServingConfig, hf: dict[str, Any] | None
) -> ByteConstants:
    given = [name for name, present in (
        ("--boot-log", boot is not None),
        ("--state-bytes-per-slot/--kv-bytes-per-token", args.state_bytes_per_slot is not None or args.kv_bytes_per_token is not None),
        ("--model-config", args.model_config is not None),
    ) if present]
    if not given:
        raise InputError("need the byte constants: give --boot-log, or --state-bytes-per-slot and --kv-bytes-per-token, or --model-config")
    if args.state_bytes_per_slot is not None or args.kv_bytes_per_token is not None:
        if args.state_bytes_per_slot is None or args.kv_bytes_per_token is None:
            raise InputError("--state-bytes-per-slot and --kv-bytes-per-token go together")
        if args.state_bytes_per_slot <= 0 or args.kv_bytes_per_token <= 0:
            raise InputError("--state-bytes-per-slot and --kv-bytes-per-token must be > 0")
        return ByteConstants(args.state_bytes_per_slot, args.kv_bytes_per_token)
    if boot is not None:
        pools = boot.pools()
        if pools.constants is not None:
            return pools.constants
        if hf is None:
            raise InputError(f"{args.boot_log}: {pools.missing}")
        # a tiny model's `0.00GB` state line: the model config gives the slot, the boot log the rest
        from_model = _constants(argparse.Namespace(**{**vars(args), "boot_log": None}), None, config, hf)
        pools = boot.pools(state_bytes_per_slot=from_model.state_bytes_per_slot)
        if pools.constants is None:
            raise InputError(f"{args.boot_log}: {pools.missing}")
        return pools.constants
    if hf is None:  # unreachable: `given` names --model-config as the only source left
        raise InputError("need --model-config")
    tp_size = args.tp_size or config.tp_size
    derived = model_bytes(
        hf,
        tp_size=tp_size,
        ssm_dtype=args.ssm_dtype or config.mamba_ssm_dtype,
        kv_dtype=args.kv_dtype or config.kv_cache_dtype,
        dcp_size=config.dcp_size,
        pp_size=config.pp_size,
    )
    draft_kv = 0.0
    if spec_enabled(config):
        draft_kv = float(eagle_draft_kv_bytes_per_token(derived, _draft_layers(hf, config)))
    ring = 0.0
    if replayssm_active(config):
        ring = float(replayssm_ring_bytes_per_request(hf, tp_size=tp_size))
    return ByteConstants(
        float(derived.state_bytes_per_slot), float(derived.kv_bytes_per_token),
        draft_kv_bytes_per_token=draft_kv, replayssm_ring_bytes_per_request=ring,
    )


# Spec algorithms that run the target checkpoint's own MTP layers (no separate draft model path).
_PATHLESS_MTP = ("NEXTN", "MTP")


def _draft_layers(hf: dict[str, Any], config: ServingConfig) -> int:
    """The draft's KV layers SGLang 0.5.23 charges in each row (model_executor/model_runner_components/
    spec_aux_hidden_state.py ~170-178): the config's `num_nextn_predict_layers` when set; else a separate draft
    model's layers (EAGLE heads: one); else, path-less MTP, none."""
    text = hf.get("text_config")
    for where in (hf, text if isinstance(text, dict) else {}):
        value = where.get("num_nextn_predict_layers")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    if (config.speculative_algorithm or "").upper() in _PATHLESS_MTP:
        return 0
    return 1


def run(args: argparse.Namespace) -> int:
    if args.prometheus_url:
        return recommend_store.run(args)
    if args.context_length is None:
        raise InputError("--context-length is required (or give --prometheus-url for one recommendation per server)")
    check_ranges(args)
    boot = read_boot_log(args.boot_log) if args.boot_log else None
    hf = load_hf_config(args.model_config) if args.model_config is not None else None
    config = _serving_config(args, boot, hf)
    constants = _constants(args, boot, config, hf)
    if args.rest_gib is not None:
        rest = args.rest_gib * GIB
    elif boot is not None:
        rest = boot.pools(state_bytes_per_slot=constants.state_bytes_per_slot).rest_bytes
    else:
        rest = None
    if boot is not None:
        _check_boot(boot, constants, rest)
    memory = MemoryFacts()
    if boot is not None:
        memory = MemoryFacts(
            card_available_gib=boot.avail_before_weights_gib,
            idle_after_pools_gib=boot.memory_pool_end_avail_gib,
            idle_after_graphs_gib=boot.available_gpu_mem_gib,
            mem_fraction_static=config.mem_fraction_static,
        )
    model_ctx = boot.context_len if boot is not None and boot.context_len else 262144
    advice = advise(config, constants, args.context_length, rest_bytes=rest, memory=memory, model_context_len=model_ctx)
    if boot is not None and args.state_bytes_per_slot is None and boot.pools().constants is None:
        advice.notes.append(
            "state bytes per slot from --model-config: the boot log's state pool line rounds to 0.00 GB (a small model) "
            "and its slot count was not set by the ratio"
        )
    out = advice.to_dict()

    live: dict[str, Any] | None = None
    if boot is not None and rest is not None:
        boot_config = _boot_config(boot)
        live_split = split_pools(rest, boot_config, constants, model_context_len=model_ctx)
        live = {
            "ratio": boot_config.mamba_full_memory_ratio,
            "logged_max_mamba_cache_size": boot.state_pool.max_mamba_cache_size,
            "predicted_max_mamba_cache_size": live_split.max_mamba_cache_size,
            "logged_max_running_requests": boot.max_running_requests,
            "predicted_max_running_requests": live_split.max_running_requests,
            "kv_capacity_requests": kv_capacity_requests(boot.kv_pool.tokens, args.context_length, config.dcp_size),
        }
        logged_slots = boot.logged_slots_per_request
        if logged_slots is not None and logged_slots != slots_per_request(boot_config):
            advice.notes.append(
                f"the boot log says {logged_slots} state slots per request but its flags give S = {slots_per_request(boot_config)}: check the strategy / env"
            )
        mismatch = clamp_mismatch(live_split.max_running_requests, boot.max_running_requests)
        if mismatch:
            advice.notes.append(mismatch)
        if slots_per_request(boot_config) != advice.slots_per_request:
            advice.notes.append(
                f"the recommendation assumes S = {advice.slots_per_request} ({advice.strategy}); the boot ran with "
                f"S = {slots_per_request(boot_config)}: change the strategy together with the ratio"
            )
        out = advice.to_dict()
    out["live"] = live
    ratio = out.get("ratio")
    if not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or not RATIO_LOW <= ratio <= RATIO_HIGH:
        raise InputError(
            f"these inputs give r* = {ratio:g}, outside [{RATIO_LOW:g}, {RATIO_HIGH:g}]: check --context-length "
            f"({args.context_length:g}) against the byte constants ({constants.state_bytes_per_slot:g} B per slot, "
            f"{constants.kv_bytes_per_token:g} B per token)"
        )
    kv_requests = out.get("kv_capacity_requests")
    if out.get("predicted_max_running_requests") == 0 and isinstance(kv_requests, (int, float)) and kv_requests < 1:
        source = f"--rest-gib {args.rest_gib:g}" if args.rest_gib is not None else "the boot log's pool budget"
        raise InputError(f"{source} holds no request of {args.context_length:g} tokens at r*: the budget is too small")
    if args.json:
        print(json.dumps(finite_or_none(out), indent=1, sort_keys=True, allow_nan=False))
        return 0
    print(_report(advice.to_dict(), live))
    return 0


def _report(a: dict[str, Any], live: dict[str, Any] | None) -> str:
    lines = [
        f"context length L        {a['context_length']:.0f} tokens",
        f"state bytes per slot    {a['state_bytes_per_slot'] / 1e6:.2f} MB   KV bytes per token {a['kv_bytes_per_token'] / 1e3:.2f} KB",
        f"token_equiv             {a['token_equiv']:.0f}",
        f"S (slots per request)   {a['slots_per_request']} ({a['strategy']})   D {a['draft_tokens']}   dcp {a['dcp_size']}",
        f"r*                      {a['ratio']:.3f}",
    ]
    if a["predicted_max_running_requests"] is not None:
        lines.append(
            f"at r*                    clamp {a['predicted_max_running_requests']} requests "
            f"(max_mamba_cache_size {a['predicted_max_mamba_cache_size']}), KV holds {a['kv_capacity_requests']:.1f} requests "
            f"-> binding pool: {a['binding_pool']}"
        )
    if live:
        lines.append(
            f"live (boot log)          r {live['ratio']:g}: clamp {live['logged_max_running_requests']} "
            f"(model: {live['predicted_max_running_requests']}), KV holds {live['kv_capacity_requests']:.1f} requests at L"
        )
    for note in a["notes"]:
        lines.append(f"note: {note}")
    lines.append("")
    lines.append(a["flag_line"])
    return "\n".join(lines)


__all__ = ["register", "run"]
