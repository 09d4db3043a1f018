"""How fast the dual-pool simulator runs: simulated seconds per wall second, one core.

Runs one simulated hour of several workloads (including 50 requests/s, both overloaded and
actually served) and one ratio sweep, and prints a table. Usage:

    python3 bench/sim_speed.py [--duration 3600] [--sweep-points 25]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from advisor.scheduler.costmodel import CostModel
from advisor.scheduler.engine import Simulator, simulate, sweep
from advisor.sim.config import SchedulerServerConfig, load_server_config
from advisor.sim.workload import Workload, load_workload


def _at_rate(workload: Workload, rate: float) -> Workload:
    return dataclasses.replace(
        workload, name=f"{workload.name}@{rate:g}/s", arrival=dataclasses.replace(workload.arrival, rate=rate)
    )


def _fast_server() -> SchedulerServerConfig:
    """A server quick enough to serve 50 short chats per second (radix cache off so S = 1, a
    decode step ~4x cheaper), so admission runs on nearly every arrival instead of idling behind
    the clamp: the simulator's most event-dense regime."""
    base = load_server_config("default")
    serving = dataclasses.replace(base.serving, disable_radix_cache=True, mamba_full_memory_ratio=2.0)
    cost = CostModel(
        decode_base_seconds=0.003,
        decode_per_request_seconds=0.00002,
        prefill_base_seconds=0.003,
        prefill_per_token_seconds=1 / 400000,
    )
    return dataclasses.replace(base, name="default-fast", serving=serving, cost=cost)


def _cases() -> list[tuple[str, SchedulerServerConfig, Workload]]:
    default = load_server_config("default")
    chat = load_workload("steady-chat")
    return [
        ("steady-chat @50/s, r=0.9 (overloaded)", default, _at_rate(chat, 50.0)),
        ("steady-chat @50/s, r=12 (overloaded)", default.with_ratio(12), _at_rate(chat, 50.0)),
        ("steady-chat @50/s, fast server (served)", _fast_server(), _at_rate(chat, 50.0)),
        ("demo @5/s, r=0.9", default, load_workload("demo")),
        ("bimodal-chat-docs @3/s, r=2.5", default.with_ratio(2.5), load_workload("bimodal-chat-docs")),
        (
            "heavy-tail-outputs, r=25 (retracting)",
            default.with_ratio(25),
            load_workload("heavy-tail-outputs"),
        ),
        ("doc-bursts, lazy", load_server_config("lazy"), load_workload("doc-bursts")),
        (
            "regime-shift, single-qwen3next",
            load_server_config("single-qwen3next"),
            load_workload("regime-shift"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--sweep-points", type=int, default=25)
    args = parser.parse_args()

    print(f"{'case':<42} {'arrived':>8} {'done':>8} {'events':>8} {'wall s':>7} {'sim s/wall s':>12}")
    for label, server, workload in _cases():
        sim = Simulator(server, workload, seed=0)
        start = time.perf_counter()
        events = 0
        done = 0
        t = 0.0
        while t < args.duration:
            t = min(t + 60.0, args.duration)
            batch = sim.advance(t)
            events += len(batch)
            done += sum(1 for e in batch if type(e).__name__ == "RequestFinished")
        wall = time.perf_counter() - start
        arrived = sim.accumulators().arrived
        print(f"{label:<42} {arrived:>8} {done:>8} {events:>8} {wall:>7.2f} {args.duration / wall:>12,.0f}")

    workload = load_workload("demo")
    server = load_server_config("default")
    ratios = [0.2 * (120 ** (i / max(args.sweep_points - 1, 1))) for i in range(args.sweep_points)]
    start = time.perf_counter()
    results = sweep(server, workload, ratios, duration=args.duration, seed=0, warmup=300)
    wall = time.perf_counter() - start
    print(
        f"sweep demo over {len(results)} ratios x {args.duration:g} s: {wall:.2f} s wall, "
        f"{len(results) * args.duration / wall:,.0f} simulated s per wall s"
    )
    start = time.perf_counter()
    simulate(server, workload, duration=args.duration, seed=0)
    print(f"simulate(demo, {args.duration:g} s): {time.perf_counter() - start:.2f} s wall")


if __name__ == "__main__":
    main()
