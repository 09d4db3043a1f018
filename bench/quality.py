"""Recommendation quality: is the advisor worth running?

For each shipped workload: the oracle ratio and goodput from a fine sweep in the simulator; the advisor's ratio
after watching the emulated server serve that workload at the default 0.9 through the real pipeline (HTTP
scrapes of /metrics and /server_info, the SGLang-format log followed from disk, the estimator, the recommender);
and goodput at the advisor's ratio, at 0.9 and at the seed's mean-L formula, each as a fraction of the oracle.

    python bench/quality.py                 # the table
    python bench/quality.py --json          # one JSON object per workload
    python bench/quality.py --state-bias 0  # what the bias knob does
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor
from advisor.model.pools import optimal_ratio_for, split_pools
from advisor.model.serving import ServingConfig
from advisor.scheduler.engine import SimResult, best_result, simulate
from advisor.sim.config import SchedulerServerConfig, load_server_config
from advisor.sim.emulator import EmulatedServer
from advisor.sim.workload import Workload, load_workload

# (workload, emulated server config) pairs: at least eight shapes of traffic.
SUITE = (
    ("steady-chat", "default"),
    ("steady-long-docs", "default"),
    ("bimodal-chat-docs", "default"),
    ("heavy-tail-outputs", "default"),
    ("regime-shift", "default"),
    ("diurnal", "default"),
    ("doc-bursts", "default"),
    ("overload", "default"),
    ("spec-decode", "spec"),
    ("dcp", "dcp8"),
)
DEFAULT_RATIO = 0.9
ACTING_DECISIONS = ("raise_ratio", "lower_ratio", "pin_state_pool")


@dataclass
class Row:
    workload: str
    server: str
    oracle_ratio: float
    oracle_goodput: float
    advisor_ratio: float  # the ratio the operator ends up running (live 0.9 unless the advisor says change)
    advisor_target_ratio: float | None
    advisor_decision: str
    advisor_pin: int | None
    formula_ratio: float
    advisor_goodput: float
    default_goodput: float
    formula_goodput: float
    watch_seconds: float

    def fractions(self) -> dict[str, float]:
        return {
            "advisor_fraction": self.advisor_goodput / self.oracle_goodput,
            "default_fraction": self.default_goodput / self.oracle_goodput,
            "formula_fraction": self.formula_goodput / self.oracle_goodput,
        }

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = dict(vars(self))
        out.update(self.fractions())
        return out


def run_at(server: SchedulerServerConfig, workload: Workload, arrivals, *, ratio: float | None = None, pin: int | None = None,
           duration: float, warmup: float, seed: int) -> SimResult:
    if pin is not None:
        serving = ServingConfig(**{**server.serving.to_dict(), "max_mamba_cache_size": pin})
        config = SchedulerServerConfig(**{**vars(server), "serving": serving})
    else:
        config = server.with_ratio(ratio if ratio is not None else server.serving.mamba_full_memory_ratio)
    return simulate(config, workload, duration=duration, seed=seed, warmup=warmup, arrivals=arrivals)


def oracle(server, workload, arrivals, *, duration, warmup, seed, points) -> tuple[float, SimResult]:
    grid = list(np.geomspace(0.05, 60.0, points))
    results = {r: run_at(server, workload, arrivals, ratio=r, duration=duration, warmup=warmup, seed=seed) for r in grid}
    best = best_result(list(results.values()))
    best_ratio = next(r for r, res in results.items() if res is best)
    fine = list(np.geomspace(best_ratio / 1.35, best_ratio * 1.35, 9))
    for r in fine:
        results[r] = run_at(server, workload, arrivals, ratio=r, duration=duration, warmup=warmup, seed=seed)
    best = best_result(list(results.values()))
    best_ratio = next(r for r, res in results.items() if res is best)
    return best_ratio, best


def watch_with_advisor(server, workload, *, speed, minutes, state_bias, seed) -> tuple[float | None, int | None, str]:
    """Serve at the default ratio on loopback; the real daemon pipeline watches; its final recommendation."""
    emulated = server.with_ratio(DEFAULT_RATIO)
    with tempfile.TemporaryDirectory(prefix="quality-") as tmp:
        log_path = str(Path(tmp) / "sglang.log")
        emulator = EmulatedServer(emulated, workload, speed=speed, seed=seed, log_path=log_path, request_log_path=log_path)
        emulator.start()
        try:
            config = config_from_dict({
                "targets": [{"name": "bench", "url": emulator.url, "log_paths": [log_path]}],
                "interval_seconds": 0.5, "time_scale": speed, "timeout_seconds": 5.0, "state_bias": state_bias,
            })
            advisor = Advisor(config)
            deadline = time.monotonic() + minutes * 60.0 / speed
            status = None
            while time.monotonic() < deadline:
                statuses = advisor.run_cycle(timeout=10.0)
                status = statuses[0] if statuses else status
                time.sleep(0.5)
            advisor.close()
        finally:
            emulator.stop()
    rec = status.recommendation if status is not None else None
    if rec is None or rec.ratio is None:
        return None, None, rec.decision if rec else "none"
    return rec.ratio, rec.recommended_max_mamba_cache_size, rec.decision


def formula_ratio(server: SchedulerServerConfig, arrivals) -> float:
    mean_context = float(np.mean([a.input_tokens + a.output_tokens for a in arrivals]))
    return optimal_ratio_for(server.serving, server.constants, mean_context)


def cached_oracle(name: str, server_name: str, server, workload, arrivals, args) -> tuple[float, float]:
    """(oracle ratio, oracle goodput), from `--oracle-cache` when the same sweep was run before."""
    key = f"{name}|{server_name}|{args.duration}|{args.warmup}|{args.seed}|{args.points}"
    cache: dict[str, list[float]] = {}
    path = Path(args.oracle_cache) if args.oracle_cache else None
    if path is not None and path.exists():
        cache = json.loads(path.read_text())
    if key not in cache:
        best_ratio, best = oracle(server, workload, arrivals, duration=args.duration, warmup=args.warmup,
                                  seed=args.seed, points=args.points)
        cache[key] = [best_ratio, best.goodput_tokens_per_second]
        if path is not None:
            path.write_text(json.dumps(cache, indent=1))
    ratio, goodput = cache[key]
    return ratio, goodput


def evaluate(name: str, server_name: str, args) -> Row:
    server = load_server_config(server_name)
    workload = load_workload(name)
    arrivals = workload.requests(args.seed, args.duration)
    best_ratio, best_goodput = cached_oracle(name, server_name, server, workload, arrivals, args)
    started = time.monotonic()
    advisor_ratio, pin, decision = watch_with_advisor(server, workload, speed=args.speed, minutes=args.watch_minutes,
                                                      state_bias=args.state_bias, seed=args.seed + 1)
    watch = time.monotonic() - started
    target_ratio = advisor_ratio
    if advisor_ratio is None or decision not in ACTING_DECISIONS:
        # the operator keeps the live config unless the advisor says to change it
        advisor_ratio, pin = DEFAULT_RATIO, None
    advisor_result = run_at(server, workload, arrivals, ratio=advisor_ratio, pin=pin, duration=args.duration,
                            warmup=args.warmup, seed=args.seed)
    if pin is not None:
        pinned = ServingConfig(**{**server.serving.to_dict(), "max_mamba_cache_size": pin})
        split = split_pools(server.rest_bytes, pinned, server.constants, model_context_len=server.model_context_len)
        advisor_ratio = split.state_pool_bytes / split.kv_pool_bytes
    default = run_at(server, workload, arrivals, ratio=DEFAULT_RATIO, duration=args.duration, warmup=args.warmup, seed=args.seed)
    f_ratio = formula_ratio(server, arrivals)
    formula = run_at(server, workload, arrivals, ratio=f_ratio, duration=args.duration, warmup=args.warmup, seed=args.seed)
    return Row(
        workload=name, server=server_name, oracle_ratio=best_ratio, oracle_goodput=best_goodput,
        advisor_ratio=advisor_ratio, advisor_target_ratio=target_ratio, advisor_decision=decision, advisor_pin=pin, formula_ratio=f_ratio,
        advisor_goodput=advisor_result.goodput_tokens_per_second, default_goodput=default.goodput_tokens_per_second,
        formula_goodput=formula.goodput_tokens_per_second, watch_seconds=watch,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workloads", help="comma-separated subset of the suite")
    parser.add_argument("--duration", type=float, default=3600.0, help="simulated seconds per goodput run")
    parser.add_argument("--warmup", type=float, default=300.0)
    parser.add_argument("--points", type=int, default=25, help="coarse sweep points (then 9 fine ones)")
    parser.add_argument("--speed", type=float, default=150.0, help="emulator speed while the advisor watches")
    parser.add_argument("--watch-minutes", type=float, default=40.0, help="simulated minutes the advisor watches")
    parser.add_argument("--state-bias", type=float, default=None, help="override the advisor's state_bias knob")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--oracle-cache", metavar="FILE", help="reuse oracle sweeps across runs (e.g. a bias sweep)")
    args = parser.parse_args(argv)
    if args.state_bias is None:
        from advisor.config import AdvisorConfig

        args.state_bias = AdvisorConfig(targets=()).state_bias
    chosen = SUITE
    if args.workloads:
        wanted = set(args.workloads.split(","))
        chosen = tuple(item for item in SUITE if item[0] in wanted)
    rows = []
    for name, server_name in chosen:
        row = evaluate(name, server_name, args)
        rows.append(row)
        if args.json:
            print(json.dumps(row.to_dict()), flush=True)
        else:
            f = row.fractions()
            print(f"{name:20s} oracle r {row.oracle_ratio:7.3g}  advisor r {row.advisor_ratio:7.3g} ({row.advisor_decision:14s})  "
                  f"formula r {row.formula_ratio:7.3g}  | goodput vs oracle: advisor {f['advisor_fraction']:6.1%}  "
                  f"0.9 {f['default_fraction']:6.1%}  formula {f['formula_fraction']:6.1%}", flush=True)
    if not args.json and rows:
        advisor = [r.fractions()["advisor_fraction"] for r in rows]
        formula_ok = all(r.fractions()["advisor_fraction"] >= r.fractions()["formula_fraction"] - 0.005 for r in rows)
        print(f"\nstate_bias {args.state_bias:g}: advisor min {min(advisor):.1%}, mean {sum(advisor) / len(advisor):.1%}; "
              f"never below the mean-L formula: {'yes' if formula_ok else 'no'}")
    return 0 if rows and all(math.isfinite(r.advisor_goodput) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
