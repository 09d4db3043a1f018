"""`pool-advisor inspect`: run the daemon's server cycle once against a server (or saved files) and print what
was observed: per-DP-rank pools and counters, the serving config, and the context-length distribution."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from advisor.config import TargetConfig, config_from_dict
from advisor.daemon.pipeline import ServerPipeline
from advisor.daemon.targets import SavedFilesSource
from advisor.errors import InputError
from advisor.feeder import observed_clamp


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="run the sources once and print what was observed")
    p.add_argument("--url", help="an SGLang server (scrapes /metrics and /server_info)")
    p.add_argument("--metrics-file", metavar="FILE", help="a saved /metrics body")
    p.add_argument("--server-info-file", metavar="FILE", help="a saved /server_info body")
    p.add_argument("--log-file", metavar="FILE", action="append", default=[], help="SGLang log / request log (repeatable)")
    p.add_argument("--api-key", default=os.environ.get("SGLANG_API_KEY"), help="SGLang --api-key (default: $SGLANG_API_KEY)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def observe(args: argparse.Namespace) -> dict[str, Any]:
    """One cycle of the daemon's server pipeline over the saved files (and the URL for what they do not give)."""
    if not (args.url or args.metrics_file or args.log_file or args.server_info_file):
        raise InputError("nothing to inspect: give --url, --metrics-file, --server-info-file or --log-file")
    # no what-if replay: inspect shows what was observed, not a recommendation
    settings = config_from_dict({"targets": [], "timeout_seconds": args.timeout, "replay_interval_seconds": 0})
    target = TargetConfig(name="inspect", url=args.url or "", api_key=args.api_key)
    source = SavedFilesSource(metrics_file=args.metrics_file, server_info_file=args.server_info_file,
                              log_files=tuple(args.log_file), url=target if args.url else None, config=settings)
    pipeline = ServerPipeline(target, settings, source)
    try:
        result = pipeline.run(time.time())
    finally:
        pipeline.close()
    report, status, known = result.report, result.status, result.view.model
    metrics, info, boot, records = report.metrics, report.server_info, report.boot, report.request_records
    errors = list(status.last_errors)
    summary = status.workload
    context_source = "request_logs" if records else ("metrics_histograms" if summary.requests_observed else None)

    ranks = []
    if metrics is not None:
        for rank in metrics.ranks:
            ranks.append({
                "dp_rank": rank.dp_rank,
                "running_requests": rank.running_requests,
                "queued_requests": rank.queued_requests,
                "retracted_requests_total": rank.retracted_requests_total,
                "kv_capacity_tokens": rank.kv_capacity_tokens,
                "kv_used_tokens": rank.kv_used_tokens,
                "kv_evictable_tokens": rank.kv_evictable_tokens,
                "state_pool_slots": rank.state_pool_slots,
                "state_slots_used": rank.state_slots_used,
                "state_slots_evictable": rank.state_slots_evictable,
                "decode_sum_seq_lens": rank.decode_sum_seq_lens,
                "live_context_mean": (rank.decode_sum_seq_lens / rank.running_requests)
                if rank.decode_sum_seq_lens is not None and rank.running_requests else None,
                "new_token_ratio": rank.new_token_ratio,
            })
    config: dict[str, Any] | None = None
    if info is not None:
        config = {
            "version": info.version,
            "model_name": info.model_name,
            "serving": info.serving.to_dict(),
            "shards": [vars(shard) for shard in info.shards],
        }
    if boot is not None:
        config = config or {}
        try:
            pools = boot.pools()
        except InputError as exc:
            errors.append(f"boot_log: {exc}")
            pools = None
        constants = pools.constants if pools is not None else None
        config["boot_log"] = {
            "max_mamba_cache_size": boot.state_pool.max_mamba_cache_size,
            "max_running_requests": boot.max_running_requests,
            "kv_capacity_tokens": boot.kv_pool.tokens,
            "state_bytes_per_slot": constants.state_bytes_per_slot if constants else None,
            "kv_bytes_per_token": constants.kv_bytes_per_token if constants else None,
            "token_equiv": constants.token_equiv if constants else None,
            "rest_bytes": pools.rest_bytes if pools is not None else None,
            # where the state bytes came from: the state pool line, the ratio, or nowhere (then `missing` says why)
            "constants_source": pools.state_from if pools is not None else None,
            "missing": pools.missing if pools is not None else None,
        }
    model: dict[str, Any] | None = None
    if (info is not None or boot is not None) and known is not None:
        serving = known.serving
        model = {
            "strategy": serving.strategy,
            "mamba_full_memory_ratio": serving.mamba_full_memory_ratio,
            "state_bytes_per_slot": known.constants.state_bytes_per_slot if known.constants else None,
            "kv_bytes_per_token": known.constants.kv_bytes_per_token if known.constants else None,
            "token_equiv": known.constants.token_equiv if known.constants else None,
            "observed_max_running_requests": _int_or_none(observed_clamp(info, boot, len(metrics.ranks) if metrics else 1)),
        }
    requests_total = metrics.requests_total if metrics is not None and metrics.requests_total is not None else (records or None)
    return {
        "ranks": ranks,
        "requests_total": requests_total,
        "model_name": (metrics.model_name if metrics else None) or (info.model_name if info else None),
        "context_length": {
            "source": context_source,
            "mean": summary.context_length_mean,
            "p50": summary.context_length_p50,
            "p90": summary.context_length_p90,
            "p99": summary.context_length_p99,
            "effective": summary.effective_context_length,
            "requests": summary.requests_observed,
        },
        "log_retractions": report.log_retractions,
        "config": config,
        "model": model,
        "errors": errors,
    }


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def run(args: argparse.Namespace) -> int:
    out = observe(args)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0 if not out["errors"] else 1
    print(f"model: {out['model_name'] or '-'}   requests: {_fmt(out['requests_total'])}")
    for rank in out["ranks"]:
        print(
            f"dp {_fmt(rank['dp_rank'])}: running {_fmt(rank['running_requests'])}, queued {_fmt(rank['queued_requests'])}, "
            f"KV {_fmt(rank['kv_used_tokens'])}/{_fmt(rank['kv_capacity_tokens'])} tokens, state slots "
            f"{_fmt(rank['state_slots_used'])}/{_fmt(rank['state_pool_slots'])}, retracted {_fmt(rank['retracted_requests_total'])}"
        )
    ctx = out["context_length"]
    print(f"context length ({ctx['source'] or 'no data'}): mean {_fmt(ctx['mean'])}, p50 {_fmt(ctx['p50'])}, "
          f"p90 {_fmt(ctx['p90'])}, p99 {_fmt(ctx['p99'])}; residence-weighted {_fmt(ctx['effective'])}")
    if out["config"]:
        serving = out["config"].get("serving")
        if serving:
            print(f"config: version {out['config'].get('version')}, strategy {serving['strategy']}, r {serving['mamba_full_memory_ratio']}, "
                  f"tp {serving['tp_size']} dp {serving['dp_size']} pp {serving['pp_size']} dcp {serving['dcp_size']}")
        if "boot_log" in out["config"]:
            b = out["config"]["boot_log"]
            print(f"boot log: max_mamba_cache_size {b['max_mamba_cache_size']}, clamp {b['max_running_requests']}, token_equiv {b['token_equiv']:.0f}")
    if out["model"] and out["model"]["token_equiv"]:
        m = out["model"]
        print(f"pools: state {_fmt(m['state_bytes_per_slot'] / 1e6)} MB/slot, KV {_fmt(m['kv_bytes_per_token'] / 1e3)} KB/token, "
              f"token_equiv {_fmt(m['token_equiv'])}, server clamp {_fmt(m['observed_max_running_requests'])} requests")
    for error in out["errors"]:
        print(f"error: {error}")
    return 0 if not out["errors"] else 1
