"""`pool-advisor demo`: an emulated SGLang hybrid server on loopback serving a shipped workload whose optimum
is far from the default 0.9, the advisor daemon watching it through the real pipeline, a progress line per
cycle, then what it learnt and where to look. `--serve` keeps everything up until Ctrl-C."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from advisor.commands.run import describe
from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor
from advisor.export.server import ExporterServer
from advisor.status import TargetStatus


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="emulated SGLang server + the advisor watching it, in about a minute")
    p.add_argument("--config", default="default", help="emulated server config (shipped name or YAML; default: default)")
    p.add_argument("--workload", default="demo", help="workload (shipped name or YAML; default: demo)")
    p.add_argument("--speed", type=float, default=60.0, help="simulated seconds per wall second (default 60)")
    p.add_argument("--seconds", type=float, default=40.0, help="wall seconds to watch before reporting (default 40)")
    p.add_argument("--listen", default="127.0.0.1:9415", help="advisor /metrics and /status (port 0: any free port)")
    p.add_argument("--serve", action="store_true", help="keep the emulator and the advisor running until Ctrl-C")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=run)


# The progress table: one row per cycle under these column headings.
PROGRESS_HEADER = (
    f"{'wall s':>6}  {'requests':>8}  {'L mean':>8}  {'L_eff':>8}  {'state sat.':>10}  {'live r':>6}  "
    f"{'recom. r':>8}  {'confid.':>7}  decision"
)


def _progress(status: TargetStatus, elapsed: float) -> str:
    rec = status.recommendation
    w = status.workload
    live = f"{rec.live_ratio:.3g}" if rec and rec.live_ratio is not None else "-"
    recommended = f"{rec.ratio:.3g}" if rec and rec.ratio is not None else "-"
    return (
        f"{elapsed:6.1f}  {w.requests_observed:8,.0f}  {w.context_length_mean or 0:8,.0f}  "
        f"{w.effective_context_length or 0:8,.0f}  {100 * (w.state_pool_saturation_ratio or 0):9.0f}%  {live:>6}  "
        f"{recommended:>8}  {rec.confidence if rec else 0:7.2f}  {rec.decision if rec else '-'}"
    )


def _start_exporter(advisor: Advisor, listen: str) -> ExporterServer:
    host, _, port = listen.rpartition(":")
    try:
        return ExporterServer(advisor.store, host=host or "127.0.0.1", port=int(port)).start()
    except OSError:
        return ExporterServer(advisor.store, host=host or "127.0.0.1", port=0).start()


def run(args: argparse.Namespace) -> int:
    from advisor.sim.config import load_server_config
    from advisor.sim.emulator import EmulatedServer
    from advisor.sim.workload import load_workload

    if not args.speed > 0 or not args.seconds > 0:
        raise ValueError("--speed and --seconds must be > 0")
    server_config = load_server_config(args.config)
    workload = load_workload(args.workload)
    workdir = Path(tempfile.mkdtemp(prefix="pool-advisor-demo-"))
    log_path = workdir / "sglang.log"
    emulator = EmulatedServer(server_config, workload, speed=args.speed, seed=args.seed, log_path=str(log_path),
                              request_log_path=str(log_path))
    emulator.start()
    print(f"emulated SGLang {server_config.version} server ({server_config.model_name}, r = "
          f"{server_config.serving.mamba_full_memory_ratio:g}) at {emulator.url}, {args.speed:g}x real time; "
          f"workload '{workload.name}'; log {log_path} (removed at exit)", flush=True)
    config = config_from_dict({
        "targets": [{"name": "demo", "url": emulator.url, "log_paths": [str(log_path)]}],
        "interval_seconds": 1.0,
        "time_scale": args.speed,
        "timeout_seconds": 2.0,
        "checkpoint_path": str(workdir / "advisor-checkpoint.json"),
        "listen": args.listen,
    })
    advisor = Advisor(config)
    exporter = _start_exporter(advisor, args.listen)
    print(f"advisor: charts at {exporter.url}/, metrics at {exporter.url}/metrics, reasoning at {exporter.url}/status\n",
          flush=True)
    print(PROGRESS_HEADER, flush=True)
    started = time.monotonic()
    status: TargetStatus | None = None
    try:
        while time.monotonic() - started < args.seconds:
            cycle_start = time.monotonic()
            statuses = advisor.run_cycle(timeout=5.0)
            if statuses:
                status = statuses[0]
                print(_progress(status, time.monotonic() - started), flush=True)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - cycle_start)))
        if status is not None:
            print("\nwhat the advisor learnt:")
            print(describe(status))
        print(f"\nlook at: {exporter.url}/ (charts), {exporter.url}/metrics (sglang_advisor_*), {exporter.url}/status "
              f"(JSON with the reasoning), {emulator.url}/metrics (the emulated server's own)")
        if not args.serve:
            print("to keep the emulator and the advisor up and browse the charts: pool-advisor demo --serve")
        if args.serve:
            print("serving until Ctrl-C ...", flush=True)
            try:
                advisor.serve_forever()
            except KeyboardInterrupt:
                pass
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        exporter.stop()
        advisor.close()
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # the log and checkpoint were only the demo's
    ok = status is not None and status.recommendation is not None and status.recommendation.ratio is not None
    return 0 if ok else 1
