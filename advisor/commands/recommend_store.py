"""`pool-advisor recommend --prometheus-url URL`: one recommendation per SGLang server from the history a
Prometheus-API store already holds (like krr), printed as a table sorted by predicted gain, or `--json`.

It is the daemon's store path run once: the history is replayed into each server's estimator and one live
cycle follows (`advisor.daemon.store_targets.StoreFleet`), so it says what `run` would say after watching
the whole window.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from advisor.config import config_from_dict
from advisor.daemon.store_targets import StoreFleet
from advisor.errors import InputError
from advisor.sources.prometheus_store import parse_duration
from advisor.status import TargetStatus
from advisor.store_config import store_target_from_dict
from advisor.validate import BOUNDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The store flags of `recommend` (the one-shot switches to this mode when --prometheus-url is given)."""
    g = p.add_argument_group("from a Prometheus store (one recommendation per server)")
    g.add_argument("--prometheus-url", metavar="URL", help="Prometheus/Thanos/Mimir/VictoriaMetrics HTTP API base URL")
    g.add_argument("--selector", default="", metavar="'{job=\"sglang\"}'", help="label matchers choosing the SGLang series")
    g.add_argument("--history", default="7d", metavar="DURATION", help="how far back to read (default 7d)")
    g.add_argument("--step", metavar="DURATION", help="replay resolution (default: history/240, at least 60s)")
    g.add_argument("--half-life", default="1h", metavar="DURATION",
                   help="the estimator's decay (default 1h, as the daemon; 1d weighs a week's history more evenly)")
    g.add_argument("--server-labels", default="instance", metavar="LABELS", help="comma-separated labels naming a server")
    g.add_argument("--server-info-url", default="http://{instance}", metavar="TEMPLATE",
                   help="a server's base URL from its labels, for /server_info (default http://{instance})")
    g.add_argument("--no-server-info", action="store_true", help="byte constants from the pool gauges only")
    g.add_argument("--assumed-ratio", type=float, metavar="R",
                   help="the live --mamba-full-memory-ratio when only gauges are read (default 0.9)")
    g.add_argument("--bearer-token-env", metavar="VAR", help="environment variable holding the store's bearer token")
    g.add_argument("--username", help="basic-auth user for the store")
    g.add_argument("--password-env", metavar="VAR", help="environment variable holding the basic-auth password")
    g.add_argument("--ca-file", metavar="PEM", help="CA bundle for the store's TLS certificate")
    g.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                   help="advisor time runs X times the wall clock (against an emulated, sped-up server)")
    g.add_argument("--store-timeout", default="60s", metavar="DURATION", help="per-query timeout (default 60s)")


def run(args: argparse.Namespace) -> int:
    history = parse_duration(args.history, "--history")
    raw: dict[str, Any] = {
        "kind": "prometheus", "url": args.prometheus_url, "selector": args.selector, "history": args.history,
        "server_labels": [x.strip() for x in str(args.server_labels).split(",") if x.strip()],
        "server_info_url": "" if args.no_server_info else args.server_info_url,
        "timeout_seconds": args.store_timeout, "forget_after_seconds": history + 3600,
    }
    optional = {"step": args.step, "assumed_ratio": args.assumed_ratio, "username": args.username,
                "ca_file": args.ca_file, "bearer_token_env": args.bearer_token_env, "password_env": args.password_env}
    raw.update({k: v for k, v in optional.items() if v is not None})
    store = store_target_from_dict(raw, "--prometheus-url", os.environ)
    # One cycle and no next one: every server's what-if replay runs in it (no per-cycle replay budget).
    config = config_from_dict({"targets": [], "half_life_seconds": parse_duration(args.half_life, "--half-life"),
                               "time_scale": args.time_scale, "replay_budget_seconds": BOUNDS["replay_budget_seconds"].high})
    fleet = StoreFleet(store, config, quiet=True)
    try:
        now = time.time()
        if fleet.bootstrap(now) == 0 and fleet.last_error:
            raise InputError(f"cannot read the store: {fleet.last_error}")
        statuses = [result.status for result in fleet.cycle(now)]
        error = fleet.last_error
    finally:
        fleet.close()
    if error and not statuses:
        raise InputError(f"cannot read the store: {error}")
    if not statuses:
        raise InputError(f"no SGLang series in {store.name} match {store.selector or '{}'} over the last {args.history}")
    statuses.sort(key=lambda s: (-((s.recommendation.predicted_gain_ratio or 1.0) if s.recommendation else 1.0), s.server))
    if args.json:
        print(json.dumps({"store": store.name, "selector": store.selector, "history_seconds": history,
                          "servers": [status_row(s) for s in statuses]}, indent=1, sort_keys=True))
    else:
        print(table(statuses))
        if error:
            print(f"note: the store answered only part of the history: {error}")
    return 0


def status_row(status: TargetStatus) -> dict[str, Any]:
    """One server's recommendation as a flat JSON object."""
    rec = status.recommendation
    return {
        "server": status.server, "model_name": status.model_name, "decision": rec.decision if rec else None,
        "live_ratio": rec.live_ratio if rec else None, "recommended_ratio": rec.ratio if rec else None,
        "ratio_lower": rec.ratio_lower if rec else None, "ratio_upper": rec.ratio_upper if rec else None,
        "predicted_gain_ratio": rec.predicted_gain_ratio if rec else None,
        "binding_pool_live": rec.binding_pool_live if rec else None,
        "flag_line": rec.flag_line if rec else None, "reason": rec.reason if rec else None,
        "notes": list(rec.notes) if rec else [], "note_codes": list(rec.note_codes) if rec else [],
        "confidence": rec.confidence if rec else None, "replay_source": rec.replay_source if rec else None,
        "predicted_goodput_gain_ratio": rec.predicted_goodput_gain_ratio if rec else None,
        "goodput_plateau": list(rec.goodput_plateau) if rec and rec.goodput_plateau else None,
        "effective_context_length": status.workload.effective_context_length,
        "requests_observed": status.workload.requests_observed, "history_seconds": status.workload.history_seconds,
        "state_pool_saturation_ratio": status.workload.state_pool_saturation_ratio,
        "retractions_per_second": status.workload.retractions_per_second, "errors": list(status.last_errors),
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(statuses: list[TargetStatus]) -> str:
    """krr-style: one line per server, widest column sized to its content."""
    header = ("SERVER", "MODEL", "LIVE R", "RECOMMENDED R", "RANGE", "GAIN", "L_EFF", "REQUESTS", "DECISION")
    rows = [header]
    for s in statuses:
        rec = s.recommendation
        gain = rec.predicted_gain_ratio if rec else None
        rows.append((
            s.server, s.model_name or "-", _num(rec.live_ratio if rec else None, ".3g"),
            _num(rec.ratio if rec else None, ".3g"),
            f"{rec.ratio_lower:.3g}-{rec.ratio_upper:.3g}" if rec and rec.ratio_lower and rec.ratio_upper else "-",
            "-" if gain is None else f"{(gain - 1) * 100:+.0f}%",
            _num(s.workload.effective_context_length, ",.0f"), f"{s.workload.requests_observed:,.0f}",
            rec.decision if rec else "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for s in statuses:
        if s.recommendation and s.recommendation.decision not in ("hold", "insufficient_data"):
            lines.append(f"{s.server}: {s.recommendation.flag_line}")
    return "\n".join(lines)


__all__ = ["add_arguments", "run", "status_row", "table"]
