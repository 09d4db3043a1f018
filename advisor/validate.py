"""The one way the advisor checks what a person gives it: one table of bounds for every number (daemon config,
`kind: prometheus` targets, CLI flags, and what a boot log claims), one number check, one "did you mean" hint
for an unknown field. A value outside is an InputError naming the field or flag (the CLI: one line, exit 2).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from advisor.errors import InputError
from advisor.scrub import shown_value


@dataclass(frozen=True)
class Bound:
    """The plausible range of one number: outside it, the input is wrong rather than unusual."""

    low: float
    high: float
    unit: str = ""
    integer: bool = False
    positive: bool = True  # zero and below are refused with "must be > 0" before the range is checked


# Every number a person gives, by its config field name (CLI flags and boot-log values use the same names).
BOUNDS: dict[str, Bound] = {
    # the daemon
    "interval_seconds": Bound(0.05, 86400.0, "seconds"),
    "timeout_seconds": Bound(0.01, 3600.0, "seconds"),
    "half_life_seconds": Bound(1.0, 3.2e8, "seconds"),
    "time_scale": Bound(1e-3, 1e6),
    "state_bias": Bound(0.0, 100.0, positive=False),
    "replay_window_seconds": Bound(60.0, 86400.0, "seconds"),
    "replay_interval_seconds": Bound(0.0, 86400.0, "seconds", positive=False),  # 0 turns the replay off
    "replay_workers": Bound(1, 64, "processes", integer=True),
    "replay_min_window_seconds": Bound(0.0, 86400.0, "seconds", positive=False),
    "replay_budget_seconds": Bound(0.0, 86400.0, "seconds", positive=False),  # per cycle, across a store's servers
    "server_info_every": Bound(1, 1e6, "cycles", integer=True),
    "stale_after_cycles": Bound(1, 1e6, "cycles", integer=True),
    "max_body_bytes": Bound(1024, 1 << 34, "bytes", integer=True),
    "max_line_bytes": Bound(256, 1 << 30, "bytes", integer=True),
    "max_labels_per_series": Bound(1, 10_000, integer=True),
    "max_series": Bound(10, 1e8, integer=True),
    # a store target's `shard: {index, total}` (0 <= index < total)
    "shard_total": Bound(1, 1e6, "shards", integer=True),
    "shard_index": Bound(0, 1e6, integer=True, positive=False),
    "max_servers_per_store": Bound(1, 100_000, "servers", integer=True),
    # a server's byte constants and pool budget (a target's overrides, `recommend` flags, a boot log's values)
    "state_bytes_per_slot": Bound(1.0, 1e12, "bytes"),
    "kv_bytes_per_token": Bound(1.0, 1e10, "bytes"),
    "rest_gib": Bound(1e-3, 1e5, "GiB"),
    "mem_fraction_static": Bound(1e-3, 1.0),
    # a ratio; r* outside this range says the inputs are inconsistent (SGLang's own examples sit within 0.1..10)
    "ratio": Bound(1e-4, 1e4),
    # `recommend` flags
    "context_length": Bound(1.0, 1e8, "tokens"),
    "tp_size": Bound(1, 4096, integer=True),
    "pp_size": Bound(1, 4096, integer=True),
    "dcp_size": Bound(1, 4096, integer=True),
    "page_size": Bound(1, 1 << 20, "tokens", integer=True),
    "draft_tokens": Bound(0, 4096, "tokens", integer=True, positive=False),
}
BOUNDS["assumed_ratio"] = BOUNDS["ratio"]


def shown(value: Any) -> str:
    """A value for an error message: a bounded repr, scrubbed (a config value may be huge or a secret)."""
    return shown_value(value)


def config_number(value: Any, name: str, bound: Bound) -> float:
    """A config field's number within its bound, else an InputError naming the field ('x.y')."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"field '{name}' must be a number, got {shown(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise InputError(f"field '{name}' must be a number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise InputError(f"field '{name}' must be a finite number, got {shown(value)}")
    if bound.integer and number != int(number):
        raise InputError(f"field '{name}' must be a whole number, got {shown(value)}")
    if bound.positive and not number > 0:
        raise InputError(f"field '{name}' must be > 0, got {shown(value)}")
    suffix = f" {bound.unit}" if bound.unit else ""
    if number < bound.low:
        raise InputError(f"field '{name}' must be >= {bound.low:g}{suffix}, got {shown(value)}")
    if number > bound.high:
        raise InputError(f"field '{name}' must be <= {bound.high:g}{suffix}, got {shown(value)}")
    return number


def check_in_bound(value: float, what: str, bound: Bound) -> None:
    """A value already a number (a flag, or what a boot log says) within its bound, else an InputError naming
    `what` (the flag, or where the value came from)."""
    suffix = f" {bound.unit}" if bound.unit else ""
    if not math.isfinite(value) or not bound.low <= value <= bound.high:
        raise InputError(f"{what} must be a finite number in [{bound.low:g}, {bound.high:g}]{suffix}, got {value:g}")


def unknown_field(name: str, known: Iterable[str], where: str) -> InputError:
    """The error for a field nobody reads, with the closest known one as a hint."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return InputError(f"unknown field '{name}' in {where}{hint}")


def check_fields(raw: dict[Any, Any], known: Iterable[str], where: str) -> None:
    """Every key of a config mapping is a string naming a known field."""
    known = set(known)
    for key in raw:
        if not isinstance(key, str):
            raise InputError(f"field names in {where} must be strings, got {shown(key)}")
        if key not in known:
            raise unknown_field(key, known, where)


__all__ = ["BOUNDS", "Bound", "check_fields", "check_in_bound", "config_number", "shown", "unknown_field"]
