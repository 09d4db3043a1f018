"""`pool-advisor inspect`: run the sources once against a server (or saved files) and print what was observed:
per-DP-rank pools and counters, the serving config, and the context-length distribution."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from advisor.errors import InputError
from advisor.estimate.workload import EstimatorSettings, WorkloadEstimator
from advisor.feeder import observed_clamp, server_model, serving_config_of
from advisor.model.serving import ServingConfig
from advisor.sources.bootlog import BootInfo
from advisor.sources.http import HttpClient
from advisor.sources.local_files import read_local_text
from advisor.sources.loglines import LogLineParser, digest
from advisor.sources.metrics import MetricsObservation, parse_metrics
from advisor.sources.scrape import scrape_metrics, scrape_server_info
from advisor.sources.server_info import ServerInfo, parse_server_info


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


MAX_INSPECT_FILE_BYTES = 1 << 30


def _read(path: str, what: str) -> str:
    return read_local_text(path, what, MAX_INSPECT_FILE_BYTES)  # a regular file only: a FIFO would hang


def observe(args: argparse.Namespace) -> dict[str, Any]:
    if not (args.url or args.metrics_file or args.log_file or args.server_info_file):
        raise InputError("nothing to inspect: give --url, --metrics-file, --server-info-file or --log-file")
    errors: list[str] = []
    metrics: MetricsObservation | None = None
    info: ServerInfo | None = None
    boot: BootInfo | None = None
    if args.metrics_file:
        metrics = parse_metrics(_read(args.metrics_file, "metrics file"))
    if args.server_info_file:
        try:
            info = parse_server_info(json.loads(_read(args.server_info_file, "server info file")))
        except json.JSONDecodeError as exc:
            raise InputError(f"server info file {args.server_info_file} is not JSON (line {exc.lineno})") from None
        except RecursionError:
            raise InputError(f"server info file {args.server_info_file} is nested too deeply") from None
    if args.url:
        with HttpClient(timeout_seconds=args.timeout, api_key=args.api_key) as client:
            if metrics is None:
                metrics, error = scrape_metrics(client, args.url)
                if error:
                    errors.append(f"metrics: {error}")
            if info is None:
                info, error = scrape_server_info(client, args.url)
                if error:
                    errors.append(f"server_info: {error}")

    now = time.time()
    estimator = WorkloadEstimator(EstimatorSettings())
    parser = LogLineParser()
    records = retractions = 0
    for path in args.log_file:
        # flush: a file that ends after the caps line (no `fired up` yet) still holds a whole boot block
        found = digest(parser.feed(_read(path, "log file").splitlines()) + parser.flush(), source=path)
        retractions += found.retracted_requests
        errors.extend(f"logs: {error}" for error in found.errors)
        boot = found.boot or boot
        records += estimator.observe_requests(now, found.request_lengths)
    context_source = "request_logs" if records else None
    if not records and metrics is not None:
        if estimator.observe_token_histograms(now, metrics.prompt_tokens_histogram, metrics.generation_tokens_histogram,
                                              metrics.prompt_tokens_total, metrics.generation_tokens_total):
            context_source = "metrics_histograms"
    summary = estimator.summary(now)

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
    if info is not None or boot is not None:
        try:
            serving = serving_config_of(info, boot)
        except InputError as exc:
            errors.append(f"boot_log: {exc}")
            serving = ServingConfig()
        known = server_model(serving, info, boot, metrics)
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
        "log_retractions": retractions,
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
