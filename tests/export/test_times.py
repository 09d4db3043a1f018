"""export.times: a moment as a UTC date with its age, at each unit's boundary, and never raw unix seconds."""

from __future__ import annotations

import math

import pytest

from advisor.export.times import age_text, utc_with_age

MOMENT = 1_796_144_531.0  # 2026-12-01 17:02:11 UTC


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s ago"), (42, "42 s ago"), (119.4, "119 s ago"), (120, "2 min ago"), (7199, "120 min ago"),
    (7200, "2 h ago"), (2 * 86400 - 1, "48 h ago"), (2 * 86400, "2 d ago"), (30 * 86400, "30 d ago"),
    (-5, "in 5 s"), (-3 * 3600, "in 3 h"),
])
def test_age_text(seconds, text):
    assert age_text(seconds) == text


def test_utc_with_age():
    assert utc_with_age(MOMENT, now=MOMENT + 42) == "2026-12-01 17:02:11 UTC (42 s ago)"
    assert utc_with_age(MOMENT, now=MOMENT + 3 * 86400) == "2026-12-01 17:02:11 UTC (3 d ago)"
    assert utc_with_age(None, now=MOMENT) == "never"
    assert utc_with_age(math.nan, now=MOMENT) == "never"
