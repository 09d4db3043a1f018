"""Standard JSON for the CLI's `--json` output and the exporter's /status: JSON has no NaN or Infinity, so a
non-finite number (an estimate not yet made, a ratio over an empty pool) is written as null."""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, through dicts (keys as strings), lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value
