"""`pool-advisor simulate`: run a workload through the SGLang dual-pool simulator at one ratio, or
sweep the ratio and print the oracle curve (goodput and retractions against r, best r marked).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from advisor.errors import InputError
from advisor.scheduler.engine import SimResult, best_result, simulate, sweep
from advisor.sim.config import available_server_configs, load_server_config
from advisor.sim.workload import available_workloads, load_workload

DEFAULT_DURATION = 1800.0
DEFAULT_SWEEP = "log:0.2:24:25"
MAX_SWEEP_POINTS = 500
BAR_WIDTH = 30


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate a workload on a hybrid SGLang server at a ratio, or sweep the ratio",
        description=(
            "Simulate SGLang's scheduling of a hybrid model under the two pools. "
            f"Shipped server configs: {', '.join(available_server_configs())}. "
            f"Shipped workloads: {', '.join(available_workloads())}."
        ),
    )
    parser.add_argument(
        "--config", metavar="FILE|NAME", help="server config (default: the workload's, else 'default')"
    )
    parser.add_argument(
        "--workload", metavar="FILE|NAME", help="workload YAML, shipped name, or request log to replay"
    )
    parser.add_argument(
        "--ratio",
        type=float,
        metavar="R",
        help="--mamba-full-memory-ratio to simulate (default: the config's)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        metavar="S",
        help="simulated seconds (default 1800)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        metavar="S",
        help="seconds excluded from the statistics (default min(300, duration/5))",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="arrival seed (default 0)")
    parser.add_argument(
        "--sweep",
        nargs="?",
        const=DEFAULT_SWEEP,
        metavar="SPEC",
        help=f"sweep r: 'start:stop:count' (linear), 'log:start:stop:count' or 'r1,r2,...' (default {DEFAULT_SWEEP})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def parse_sweep(spec: str) -> list[float]:
    """Ratios from 'start:stop:count', 'log:start:stop:count' or a comma list."""
    text = spec.strip()
    try:
        if ":" in text:
            parts = text.split(":")
            geometric = parts[0].strip().lower() == "log"
            if geometric:
                parts = parts[1:]
            if len(parts) != 3:
                raise InputError(f"--sweep {spec!r}: expected start:stop:count")
            start, stop, count = float(parts[0]), float(parts[1]), int(parts[2])
            if count < 1 or count > MAX_SWEEP_POINTS:
                raise InputError(f"--sweep {spec!r}: count must be in 1..{MAX_SWEEP_POINTS}")
            if start <= 0 or stop <= 0:
                raise InputError(f"--sweep {spec!r}: ratios must be > 0")
            values = np.geomspace(start, stop, count) if geometric else np.linspace(start, stop, count)
            ratios = [float(v) for v in values]
        else:
            ratios = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(
            f"--sweep {spec!r}: not 'start:stop:count', 'log:start:stop:count' or a comma list of numbers"
        ) from None
    if not ratios:
        raise InputError(f"--sweep {spec!r}: no ratios")
    if len(ratios) > MAX_SWEEP_POINTS:
        raise InputError(f"--sweep {spec!r}: at most {MAX_SWEEP_POINTS} ratios")
    for ratio in ratios:
        if not math.isfinite(ratio) or ratio <= 0:
            raise InputError(f"--sweep {spec!r}: ratios must be finite and > 0, got {ratio}")
    return sorted(set(ratios))


def run(args: argparse.Namespace) -> int:
    if not args.duration > 0 or not math.isfinite(args.duration):
        raise InputError(f"--duration must be > 0 seconds, got {args.duration}")
    warmup = args.warmup if args.warmup is not None else min(300.0, args.duration / 5)
    if not 0 <= warmup < args.duration:
        raise InputError(f"--warmup must be in [0, duration), got {warmup}")
    if args.ratio is not None and (not math.isfinite(args.ratio) or args.ratio <= 0):
        raise InputError(f"--ratio must be > 0, got {args.ratio}")
    workload = load_workload(args.workload)
    server = load_server_config(args.config or workload.server)
    if args.ratio is not None:
        server = server.with_ratio(args.ratio)

    if args.sweep is None:
        result = simulate(server, workload, duration=args.duration, seed=args.seed, warmup=warmup)
        if args.json:
            print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        else:
            print(format_result(result))
        return 0

    ratios = parse_sweep(args.sweep)
    results = sweep(server, workload, ratios, duration=args.duration, seed=args.seed, warmup=warmup)
    best = best_result(results)
    mean_context = best.mean_request_context
    formula = best.formula_ratio  # the same arrivals at every r: one mean context, one formula r*
    if args.json:
        print(
            json.dumps(
                {
                    "server": server.name,
                    "workload": workload.name,
                    "seed": args.seed,
                    "duration": args.duration,
                    "warmup": warmup,
                    "best_ratio": best.ratio,
                    "formula_ratio": formula,
                    "mean_request_context": mean_context,
                    "results": [r.to_dict() for r in results],
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        print(format_sweep(results, best, formula))
    return 0


def _fmt_ratio(ratio: float | None) -> str:
    return "pinned" if ratio is None else f"{ratio:.3g}"


def format_result(result: SimResult) -> str:
    rows = [
        ("server / workload", f"{result.server} / {result.workload} (seed {result.seed})"),
        ("ratio r", _fmt_ratio(result.ratio)),
        (
            "state slots (max_mamba_cache_size)",
            f"{result.max_mamba_cache_size} (S = {result.slots_per_request})",
        ),
        ("max_running_requests (clamp)", str(result.max_running_requests)),
        ("KV pool (tokens per rank)", f"{result.kv_capacity_tokens:,}"),
        ("simulated", f"{result.duration:g} s ({result.warmup:g} s warmup excluded)"),
        (
            "arrived / completed / aborted",
            f"{result.arrived_requests} / {result.completed_requests} / {result.aborted_requests}",
        ),
        ("still in system at the end", str(result.in_system_at_end)),
        (
            "goodput",
            f"{result.goodput_tokens_per_second:,.0f} tok/s, {result.goodput_requests_per_second:.3f} req/s",
        ),
        (
            "retractions",
            f"{result.retractions} events, {result.retracted_requests} requests, {result.wasted_tokens:,} tokens wasted",
        ),
        (
            "queue time p50 / p90 / p99",
            f"{result.queue_time_p50:.2f} / {result.queue_time_p90:.2f} / {result.queue_time_p99:.2f} s",
        ),
        ("mean running requests", f"{result.mean_running_requests:.1f}"),
        (
            "bound by state / KV",
            f"{result.state_bound_fraction:.0%} / {result.kv_bound_fraction:.0%} of the time",
        ),
        ("mean live context", f"{result.mean_live_context:,.0f} tokens"),
        ("mean request context L", f"{result.mean_request_context:,.0f} tokens"),
        (
            "formula r* = (S+D)*token_equiv*dcp/L",
            "n/a" if result.formula_ratio is None else f"{result.formula_ratio:.3g}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def format_sweep(results: list[SimResult], best: SimResult, formula: float | None) -> str:
    top = max((r.goodput_tokens_per_second for r in results), default=0.0) or 1.0
    first = results[0]
    lines = [
        f"sweep: server {first.server}, workload {first.workload}, seed {first.seed}, "
        f"{first.duration:g} s ({first.warmup:g} s warmup), S = {first.slots_per_request}",
        f"{'':1} {'r':>7} {'clamp':>6} {'KV tokens':>10} {'tok/s':>8} {'req/s':>7} {'retract':>7} "
        f"{'state%':>6} {'kv%':>5} {'q p90 s':>8}  goodput",
    ]
    for r in results:
        mark = "*" if r is best else " "
        bar = "#" * max(0, round(BAR_WIDTH * r.goodput_tokens_per_second / top))
        lines.append(
            f"{mark} {_fmt_ratio(r.ratio):>7} {r.max_running_requests:>6} {r.kv_capacity_tokens:>10,} "
            f"{r.goodput_tokens_per_second:>8,.0f} {r.goodput_requests_per_second:>7.3f} {r.retracted_requests:>7} "
            f"{r.state_bound_fraction * 100:>6.0f} {r.kv_bound_fraction * 100:>5.0f} {r.queue_time_p90:>8.1f}  {bar}"
        )
    lines.append(
        f"best r = {_fmt_ratio(best.ratio)} (* above): {best.goodput_tokens_per_second:,.0f} tok/s, "
        f"{best.retracted_requests} retracted, queue p90 {best.queue_time_p90:.1f} s"
    )
    if formula is not None:
        lines.append(
            f"formula r* = (S+D)*token_equiv*dcp/L = {formula:.3g} "
            f"(L = {best.mean_request_context:,.0f} tokens, token_equiv = {best.token_equiv:,.0f})"
        )
    return "\n".join(lines)
