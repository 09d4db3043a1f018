"""Notes carry codes as reasons do: tools and tests read `note_codes`, people read `notes`."""

import pytest

from advisor.recommend.types import NOTE_CODES, Recommendation


def test_a_note_is_said_once_per_call_and_its_code_recorded_once():
    rec = Recommendation(decision="hold", reason="r")
    rec.add_note("constants_from_pool_gauges", "byte constants from the gauges")
    rec.add_note("constants_from_pool_gauges", "byte constants from the gauges, again")
    assert rec.notes == ["byte constants from the gauges", "byte constants from the gauges, again"]
    assert rec.note_codes == ["constants_from_pool_gauges"]


def test_an_unknown_code_is_refused():
    rec = Recommendation(decision="hold", reason="r")
    with pytest.raises(ValueError, match="unknown note code 'gauges'"):
        rec.add_note("gauges", "text")
    assert rec.notes == [] and "gauges" not in NOTE_CODES
