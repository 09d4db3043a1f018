"""`pool-advisor simulate`: one run, a sweep, JSON keys, config/workload files, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import RESULT_KEYS

from advisor.cli import main
from advisor.commands.simulate import parse_sweep
from advisor.errors import InputError
from advisor.sim.config import load_server_config

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["simulate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_single_run_json(capsys):
    code, out, _ = _run(
        capsys, "--config", "default", "--workload", "demo", "--ratio", "2", "--duration", "300", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert RESULT_KEYS <= set(data)
    assert data["ratio"] == 2.0 and data["server"] == "default" and data["workload"] == "demo"
    split = load_server_config("default").with_ratio(2).split()
    assert data["max_running_requests"] == split.max_running_requests
    assert data["kv_capacity_tokens"] == split.kv_capacity_tokens
    assert data["warmup"] == 60.0  # min(300, duration / 5)


def test_single_run_text_uses_the_workloads_server(capsys):
    code, out, _ = _run(capsys, "--workload", "spec-decode", "--duration", "200")
    assert code == 0
    assert "spec / spec-decode" in out
    assert "max_running_requests (clamp)" in out and "goodput" in out


def test_sweep_json_has_results_and_best_ratio(capsys):
    code, out, _ = _run(capsys, "--workload", "demo", "--sweep", "0.5,3,30", "--duration", "400", "--json")
    assert code == 0
    data = json.loads(out)
    assert [r["ratio"] for r in data["results"]] == [0.5, 3.0, 30.0]
    assert all(RESULT_KEYS <= set(r) for r in data["results"])
    assert data["best_ratio"] in (0.5, 3.0, 30.0)
    best = max(data["results"], key=lambda r: r["goodput_tokens_per_second"])
    assert data["best_ratio"] == best["ratio"]
    assert data["formula_ratio"] > 0 and data["mean_request_context"] > 0


def test_sweep_text_marks_the_best_ratio(capsys):
    code, out, _ = _run(capsys, "--workload", "demo", "--sweep", "1:9:3", "--duration", "300")
    assert code == 0
    rows = [line for line in out.splitlines() if line[:1] in ("*", " ") and line[2:9].strip()[:1].isdigit()]
    assert len(rows) == 3
    assert sum(row.startswith("*") for row in rows) == 1
    assert "best r =" in out and "formula r* =" in out


def test_config_and_workload_files(capsys, tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text(
        "name: mine\nserving: {mamba_full_memory_ratio: 3.5}\n"
        "constants: {state_bytes_per_slot: 1 KiB, kv_bytes_per_token: 1}\nrest_bytes: 64 KiB\n"
    )
    code, out, _ = _run(
        capsys,
        "--config",
        str(config),
        "--workload",
        str(LOGS / "requests-json.log"),
        "--duration",
        "120",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["server"] == "mine" and data["workload"] == "requests-json"
    assert data["arrived_requests"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "workload 'nope'"),
        (["--config", "nope"], "server config 'nope'"),
        (["--sweep", "1:2"], "--sweep"),
        (["--sweep", "a,b"], "--sweep"),
        (["--ratio", "-1"], "--ratio"),
        (["--duration", "0"], "--duration"),
        (["--duration", "100", "--warmup", "200"], "--warmup"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_parse_sweep_forms():
    assert parse_sweep("1:3:3") == [1.0, 2.0, 3.0]
    assert parse_sweep("log:1:100:3") == pytest.approx([1.0, 10.0, 100.0])
    assert parse_sweep("2, 0.5,2") == [0.5, 2.0]
    for bad in ("0:1:3", "1:2:0", "", "x"):
        with pytest.raises(InputError):
            parse_sweep(bad)
