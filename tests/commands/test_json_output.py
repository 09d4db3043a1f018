"""--json output is standard JSON: non-finite numbers become null at any depth."""

import json
import math

from advisor.json_output import finite_or_none


def test_non_finite_numbers_become_null_at_any_depth():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (2.5, "x"), "e": 3}
    cleaned = finite_or_none(value)
    assert cleaned == {"a": None, "b": [1.0, None, {"c": None}], "d": [2.5, "x"], "e": 3}
    json.dumps(cleaned, allow_nan=False)  # raises ValueError on any NaN/Infinity left
