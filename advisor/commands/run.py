"""`pool-advisor run`: the daemon (or `--once`: one cycle, printed). Config from a YAML file, then
POOL_ADVISOR_* environment variables, then flags."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from advisor.config import AdvisorConfig, build_config
from advisor.daemon.checkpoint import checkpoint_path_problem
from advisor.daemon.runner import Advisor
from advisor.errors import InputError
from advisor.export.server import DEFAULT_MAX_CONNECTIONS, ExporterServer
from advisor.export.webconfig import load_web_config
from advisor.json_output import finite_or_none
from advisor.status import TargetStatus


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="YAML config (targets, interval, listen, checkpoint, ...)")
    p.add_argument("--target", dest="target_urls", action="append", metavar="URL", help="an SGLang server URL (repeatable)")
    p.add_argument("--interval", dest="interval_seconds", type=float, metavar="SECONDS")
    p.add_argument("--listen", metavar="HOST:PORT", help="where to serve /metrics, / and /status (default 127.0.0.1:9415)")
    p.add_argument("--checkpoint", dest="checkpoint_path", metavar="FILE")
    p.add_argument("--half-life", dest="half_life_seconds", type=float, metavar="SECONDS")
    p.add_argument("--state-bias", dest="state_bias", type=float, metavar="K", help="bias toward the state pool per unit spikiness")


def config_from_args(args: argparse.Namespace) -> AdvisorConfig:
    overrides = {
        "target_urls": args.target_urls,
        "interval_seconds": args.interval_seconds,
        "listen": args.listen,
        "checkpoint_path": args.checkpoint_path,
        "half_life_seconds": args.half_life_seconds,
        "state_bias": args.state_bias,
    }
    return build_config(args.config, dict(os.environ), overrides)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="the advisor daemon: scrape, estimate, recommend, export")
    add_config_flags(p)
    p.add_argument("--once", action="store_true", help="run one cycle, print the recommendation and exit")
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    p.add_argument("--log-level", choices=LOG_LEVELS, default=os.environ.get("POOL_ADVISOR_LOG_LEVEL", "info").lower(),
                   help="info: one line per cycle with each decision (default; env POOL_ADVISOR_LOG_LEVEL)")
    p.add_argument("--web-config-file", metavar="FILE", default=os.environ.get("POOL_ADVISOR_WEB_CONFIG_FILE"),
                   help="TLS and basic auth for /metrics, / and /status, as Prometheus' exporter web config "
                        "(tls_server_config, basic_auth_users with bcrypt hashes; env POOL_ADVISOR_WEB_CONFIG_FILE)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   default=_env_int("POOL_ADVISOR_EXPORTER_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS),
                   help=f"connections the exporter holds at once; beyond it the oldest client still sending its "
                        f"request is dropped (default {DEFAULT_MAX_CONNECTIONS}, at most half the descriptor limit; "
                        "env POOL_ADVISOR_EXPORTER_MAX_CONNECTIONS)")
    p.set_defaults(handler=run)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return -1  # refused with a one-line error naming the setting when the exporter starts


LOG_LEVELS = ("debug", "info", "warning", "error")


def describe(status: TargetStatus) -> str:
    rec = status.recommendation
    lines = [f"{status.server} ({status.model_name or 'model unknown'}): {'up' if status.up else 'DOWN'}"]
    w = status.workload
    if w.context_length_mean is not None:
        lines.append(
            f"  context length: mean {w.context_length_mean:,.0f}, p50 {w.context_length_p50:,.0f}, p90 {w.context_length_p90:,.0f}, "
            f"p99 {w.context_length_p99:,.0f}; L_eff {w.effective_context_length or 0:,.0f}; spikiness {w.spikiness or 0:.2f}; "
            f"{w.requests_observed:,.0f} requests"
        )
    if rec is not None:
        lines.append(f"  decision: {rec.decision} (confidence {rec.confidence:.2f})")
        if rec.ratio is not None:
            live = f"{rec.live_ratio:.3g}" if rec.live_ratio is not None else "?"
            lines.append(
                f"  ratio: live {live} -> recommended {rec.ratio:.3g} [{rec.ratio_lower:.3g}, {rec.ratio_upper:.3g}]"
            )
        if rec.predicted_max_running_requests_live is not None:
            lines.append(
                f"  clamp: live {rec.predicted_max_running_requests_live} ({rec.binding_pool_live} binds) -> "
                f"{rec.predicted_max_running_requests_recommended} ({rec.binding_pool_recommended}); "
                f"predicted gain x{rec.predicted_gain_ratio or 1:.2f}"
            )
        lines.append(f"  why: {rec.reason}")
        for note in rec.notes:
            lines.append(f"  note: {note}")
        if rec.flag_line and rec.decision in ("raise_ratio", "lower_ratio", "pin_state_pool"):
            lines.append(f"  flags: {rec.flag_line}")
    for error in status.last_errors:
        lines.append(f"  error: {error}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.log_level not in LOG_LEVELS:
        raise InputError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {args.log_level!r}")
    checkpoint_problem = checkpoint_path_problem(config.checkpoint_path) if config.checkpoint_path else None
    if checkpoint_problem:  # a device or FIFO named as the checkpoint would be replaced by the first write
        raise InputError(checkpoint_problem)
    web_config = load_web_config(args.web_config_file) if args.web_config_file and not args.once else None
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.log_level != "debug":  # APScheduler logs two INFO lines per run; our own cycle line says more
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    advisor = Advisor(config)
    problem = advisor.load_checkpoint()
    if problem:
        print(f"pool-advisor run: warning: {problem}", file=sys.stderr)
    if args.once:
        statuses = advisor.run_cycle(timeout=config.timeout_seconds * 3 + 5)
        advisor.close()
        if args.json:
            # standard JSON: a non-finite estimate is null, never NaN/Infinity
            print(json.dumps(finite_or_none([s.to_dict() for s in statuses]), indent=1, default=str, allow_nan=False))
        else:
            print("\n".join(describe(s) for s in statuses))
        return 0 if all(s.up for s in statuses) else 1
    exporter = ExporterServer(advisor.store, host=config.listen_host, port=config.listen_port, web_config=web_config,
                              max_connections=args.max_connections,
                              healthz_stale_after=max(60.0, 5 * config.interval_seconds)).start()
    print(f"pool-advisor: watching {len(config.targets)} target(s) and {len(config.store_targets)} store(s); metrics at {exporter.url}/metrics, status at {exporter.url}/status",
          file=sys.stderr, flush=True)
    try:
        return advisor.serve_forever()
    finally:
        exporter.stop()
