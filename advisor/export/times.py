"""export.times: how the landing page writes a moment — a UTC date with its age ("2026-12-01 17:02:11 UTC
(42 s ago)"), never raw unix seconds. Pure: the current time is an argument."""

from __future__ import annotations

import math
from datetime import datetime, timezone


def age_text(seconds: float) -> str:
    """A duration as people read an age: seconds under 2 min, minutes under 2 h, hours under 2 days, then
    days; a moment ahead of `now` (another host's clock) says so."""
    ahead = seconds < 0
    seconds = abs(seconds)
    if seconds < 120:
        amount = f"{seconds:.0f} s"
    elif seconds < 2 * 3600:
        amount = f"{seconds / 60:.0f} min"
    elif seconds < 2 * 86400:
        amount = f"{seconds / 3600:.0f} h"
    else:
        amount = f"{seconds / 86400:.0f} d"
    return f"in {amount}" if ahead else f"{amount} ago"


def utc_with_age(timestamp: float | None, now: float) -> str:
    """`timestamp` (unix seconds) as "YYYY-MM-DD HH:MM:SS UTC (age)"; "never" when there is none."""
    if timestamp is None or not math.isfinite(timestamp):
        return "never"
    moment = datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{moment} ({age_text(now - timestamp)})"
