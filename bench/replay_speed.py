"""What one what-if replay costs: an hour of observed traffic replayed through the scheduler model at every
candidate ratio (the daemon runs one every `replay_interval_seconds`), per workload, in the daemon's own
process and spread over worker processes (`replay_workers`), side by side in one run.

A metrics-only picture is first checked at the live ratio against the running batch's length the server showed,
and re-paired (one more run at the live ratio a round) while they differ: the `calib` columns time that replay
in the daemon's process with the shown length `--shown-gap` above the replay's own (0 to skip), and count the
extra runs. The server's queue is checked there too: the `queue` columns time the replay with the server's
queue-time histogram showing `--queue-gap` more of its requests beyond the bound than the replay's own (0 to
skip), which brackets and bisects a heavier load at the live ratio and replays the whole curve that heavy too,
and count the runs it adds. The `work` columns time it with the server's admission rate `--work-gap` above the
replay's own (a metrics-only picture's outputs scaled until the replay admits as fast; 0 to skip).

Two last rows time the daemon's 30-minute window 15 minutes after a regime shift, where the new regime is replayed
on its own too, and a window whose last 5 minutes came 1.4x faster (a ramp), where the window is replayed that
much heavier too (`--no-shift-row` skips both).

    python3 bench/replay_speed.py [--window 3600] [--workloads steady-chat,doc-bursts] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from advisor.daemon import replay_pool
from advisor.estimate.traffic import ExactRequest, TrafficEstimator, TrafficSettings
from advisor.model.pools import optimal_ratio_for
from advisor.recommend.replay import ReplaySettings, replay_curve, run_ratios
from advisor.scheduler.server import SchedulerServerConfig
from advisor.scheduler.types import RequestSpec
from advisor.sim.config import load_server_config
from advisor.sim.workload import load_workload

# underload: a flat curve the live 0.9 holds on, where the heavier-traffic and capacity pairs run (4 more runs)
DEFAULT_WORKLOADS = "steady-chat,bimodal-chat-docs,doc-bursts,heavy-tail-outputs,overload,diurnal,underload"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=3600.0, help="seconds of traffic replayed")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    parser.add_argument("--server", default="default")
    parser.add_argument("--workers", default="1,2", help="comma-separated replay_workers to time side by side")
    parser.add_argument("--shown-gap", type=float, default=0.15,
                        help="the shown batch length over the replay's own for the calibrated timing (0: skip)")
    parser.add_argument("--queue-gap", type=float, default=0.25,
                        help="the server's share queued beyond the bound over the replay's, for the queue timing (0: skip)")
    parser.add_argument("--work-gap", type=float, default=0.05,
                        help="the server's admission rate over the replay's, for the work timing (0: skip)")
    parser.add_argument("--no-shift-row", dest="shift_row", action="store_false",
                        help="skip the rows of a 30-minute window 15 minutes after a regime shift and of a rising one")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    server = load_server_config(args.server)
    # wall seconds per worker count; with one worker also the process's CPU seconds, which a shared machine's
    # other load inflates far less than the wall time
    timing = "".join(f" {f'w={w} s':>8s} {'s/run':>6s}" + (f" {'cpu s':>6s}" if w == 1 else "") for w in workers)
    if args.shown_gap > 0:
        timing += f" {'calib s':>7s} {'+runs':>5s}"
    if args.queue_gap > 0:
        timing += f" {'queue s':>7s} {'+runs':>5s}"
    if args.work_gap > 0:
        timing += f" {'work s':>7s} {'+runs':>5s}"
    print(f"{'workload':22s} {'observed':>8s} {'replayed':>8s} {'runs':>4s}{timing}  chosen r (prior)")
    rows = [(name, load_workload(name).requests(1, args.window), args.window) for name in args.workloads.split(",")]
    if args.shift_row:
        # The daemon's 30-minute window 15 minutes after a regime shift: the new regime is replayed as well, on its
        # own, as if it had filled the window (`regime_curve`), so a cycle after a shift costs two replays.
        shifted = [replace(r, time=r.time - 300.0) for r in load_workload("regime-shift").requests(1, 2100.0)
                   if r.time >= 300.0]
        rows.append(("regime-shift (15 min in)", shifted, 1800.0))
        # ... and one whose last 5 minutes came 1.4x as fast (a morning's ramp): the window is replayed as heavy as
        # they came too (`trend_curve`), so a cycle under a trend costs two replays as well.
        rising = [r if r.time < 1500.0 else replace(r, time=1500.0 + (r.time - 1500.0) / 1.4)
                  for r in load_workload("steady-chat").requests(1, 1920.0)]
        rows.append(("steady-chat, rising", rising, 1800.0))
    for name, requests, window in rows:
        _time_row(name, requests, window, server, workers, args.shown_gap, args.queue_gap, args.work_gap)
    replay_pool.shutdown()
    return 0


def _time_row(name: str, requests: list[RequestSpec], window: float, server: SchedulerServerConfig, workers: list[int],
              shown_gap: float, queue_gap: float, work_gap: float = 0.0) -> None:
    """One line: the replay of `window` seconds of `requests` timed at each worker count (and calibrated)."""
    # through the daemon's traffic picture, so its cap on replayed requests applies
    traffic = TrafficEstimator(TrafficSettings(window_seconds=window))
    traffic.observe_requests([ExactRequest(r.time, r.input_tokens, r.output_tokens, r.max_new_tokens)
                              for r in requests])
    picture = traffic.picture()
    if picture is None:
        return
    mean_context = float(np.mean([r.input_tokens + r.output_tokens for r in requests]))
    prior = optimal_ratio_for(server.serving, server.constants, mean_context)
    cells, curve = "", None
    for count in workers:
        if count > 1:  # the worker processes start once, before the timing (the daemon keeps them)
            replay_curve(server, picture, prior_ratio=prior, live_ratio=0.9, run_many=replay_pool.runner(count))
        started, cpu_started = time.perf_counter(), time.process_time()
        curve = replay_curve(server, picture, prior_ratio=prior, live_ratio=0.9,
                             run_many=replay_pool.runner(count))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if curve is None:
            break
        cells += f" {elapsed:8.2f} {elapsed / curve.runs:6.3f}" + (f" {cpu:6.2f}" if count == 1 else "")
    if curve is None:
        print(f"{name:22s} {len(requests):8d}  (too few requests to replay)")
        return
    # the replay's own run at the live ratio, which each gap below is set against
    own = run_ratios(server, picture, [0.9], ReplaySettings())[0]
    if shown_gap > 0:
        shown = replace(picture, live_context=own.mean_live_context * (1 + shown_gap),
                        live_running=own.mean_busy_running_requests)
        started = time.perf_counter()
        calibrated = replay_curve(server, shown, prior_ratio=prior, live_ratio=0.9)
        rounds = calibrated.calibration_rounds if calibrated else 0
        cells += f" {time.perf_counter() - started:7.2f} {rounds:5d}"
    if queue_gap > 0:
        over = min(1.0, own.admitted_over_bound_requests / max(1, own.admitted_requests) + queue_gap)
        queued = replace(picture, live_queue_times=((10.0, float("inf")), (1.0 - over, over)))
        started = time.perf_counter()
        checked = replay_curve(server, queued, prior_ratio=prior, live_ratio=0.9)
        added = checked.runs - curve.runs if checked else 0
        cells += f" {time.perf_counter() - started:7.2f} {added:5d}"
    if work_gap > 0:
        admitted = own.admitted_requests * (1 + work_gap)  # over the replay's measured part
        unshown = replace(picture, source="metrics")
        plain = replay_curve(server, unshown, prior_ratio=prior, live_ratio=0.9)
        # every admission within the queue bound: the queue check has nothing to add
        busier = replace(unshown, live_queue_times=((10.0, float("inf")), (admitted, 0.0)),
                         live_queue_series=((own.warmup, own.duration, (admitted, 0.0)),))
        started = time.perf_counter()
        matched = replay_curve(server, busier, prior_ratio=prior, live_ratio=0.9)
        added = matched.runs - plain.runs if matched and plain else 0
        cells += f" {time.perf_counter() - started:7.2f} {added:5d}"
    regime = f", regime {curve.regime_seconds:.0f} s" if curve.regime_seconds is not None else ""
    regime += f", trend {curve.trend_load:.2f}x" if curve.trend_load is not None else ""
    print(f"{name:22s} {len(requests):8d} {len(picture.requests):8d} {curve.runs:4d}{cells}  "
          f"{curve.chosen_ratio:.3g} ({prior:.3g}){regime}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
