"""`recommend`: every numeric input range-checked with a message naming it (exit 2); JSON output is standard
(no NaN/Infinity) and the ratio it prints is finite and plausible, whatever numbers come in."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import LOGS

from advisor.cli import main


def _strict_json(text: str) -> object:
    def reject(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=reject)


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["-L", "nan"], "--context-length"),
        (["-L", "inf"], "--context-length"),
        (["-L", "1e300"], "--context-length"),
        (["-L", "9216", "--rest-gib", "-3"], "--rest-gib"),
        (["-L", "9216", "--rest-gib", "inf"], "--rest-gib"),
        (["-L", "9216", "--page-size", "0"], "--page-size"),
        (["-L", "9216", "--draft-tokens", "-5"], "--draft-tokens"),
        (["-L", "9216", "--tp-size", "0"], "--tp-size"),
        (["-L", "9216", "--dcp-size", "100000"], "--dcp-size"),
    ],
)
def test_each_numeric_flag_is_named(extra: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["recommend", "--state-bytes-per-slot", "56.4e6", "--kv-bytes-per-token", "13.8e3", *extra])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--state-bytes-per-slot", "1e30", "--kv-bytes-per-token", "1", "-L", "9216"], "--state-bytes-per-slot"),
        (["--state-bytes-per-slot", "1e12", "--kv-bytes-per-token", "1", "-L", "1"], "outside"),  # r* 5e12
        (["--state-bytes-per-slot", "56e6", "--kv-bytes-per-token", "13e3", "-L", "9216", "--rest-gib", "0.01"], "--rest-gib"),
    ],
)
def test_nonsense_results_are_refused(args: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["recommend", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and named in err and out == ""


def test_boot_log_json_is_standard(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["recommend", "--boot-log", str(LOGS / "boot-tp8-default.log"), "-L", "9216", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    data = _strict_json(out)
    assert isinstance(data, dict) and 0 < data["ratio"] < 10


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=1e-3, max_value=1e7),
    st.sampled_from([0.0, -1.0, 1e-300, 1e308, 9216.0, 56.4e6, 13.8e3]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=NUMBERS, kv=NUMBERS, length=NUMBERS, rest=st.one_of(st.none(), NUMBERS))
def test_any_numbers_give_exit_2_or_standard_json(state, kv, length, rest, capsys) -> None:
    argv = ["recommend", "--state-bytes-per-slot", repr(state), "--kv-bytes-per-token", repr(kv), "-L", repr(length), "--json"]
    if rest is not None:
        argv += ["--rest-gib", repr(rest)]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse refuses e.g. "-1.0" after -L: usage error, exit 2
        code = exit_.code
    out, err = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert "Traceback" not in err and out == ""
        return
    data = _strict_json(out)
    assert isinstance(data, dict)
    assert math.isfinite(data["ratio"]) and 1e-4 <= data["ratio"] <= 1e4
