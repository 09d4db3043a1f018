"""What one what-if replay costs: an hour of observed traffic replayed through the scheduler model at every
candidate ratio (the daemon runs one every `replay_interval_seconds`), per workload, on one core.

    python3 bench/replay_speed.py [--window 3600] [--workloads steady-chat,doc-bursts]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from advisor.estimate.traffic import ExactRequest, TrafficEstimator, TrafficSettings
from advisor.model.pools import optimal_ratio_for
from advisor.recommend.replay import replay_curve
from advisor.sim.config import load_server_config
from advisor.sim.workload import load_workload

DEFAULT_WORKLOADS = "steady-chat,bimodal-chat-docs,doc-bursts,heavy-tail-outputs,overload,diurnal"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=3600.0, help="seconds of traffic replayed")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    parser.add_argument("--server", default="default")
    args = parser.parse_args(argv)
    server = load_server_config(args.server)
    print(f"{'workload':22s} {'observed':>8s} {'replayed':>8s} {'runs':>4s} {'replay s':>8s} {'s/run':>6s}  chosen r (prior)")
    for name in args.workloads.split(","):
        requests = load_workload(name).requests(1, args.window)
        # through the daemon's traffic picture, so its cap on replayed requests applies
        traffic = TrafficEstimator(TrafficSettings(window_seconds=args.window))
        traffic.observe_requests([ExactRequest(r.time, r.input_tokens, r.output_tokens, r.max_new_tokens)
                                  for r in requests])
        picture = traffic.picture()
        if picture is None:
            continue
        mean_context = float(np.mean([r.input_tokens + r.output_tokens for r in requests]))
        prior = optimal_ratio_for(server.serving, server.constants, mean_context)
        started = time.perf_counter()
        curve = replay_curve(server, picture, prior_ratio=prior, live_ratio=0.9)
        elapsed = time.perf_counter() - started
        if curve is None:
            print(f"{name:22s} {len(requests):8d}  (too few requests to replay)")
            continue
        runs = len(curve.points)
        print(f"{name:22s} {len(requests):8d} {len(picture.requests):8d} {runs:4d} {elapsed:8.2f} {elapsed / runs:6.3f}  "
              f"{curve.chosen_ratio:.3g} ({prior:.3g})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
