"""Config validation: every hostile value is an InputError naming its field, and `run` exits 2 on it."""

from __future__ import annotations

import os

import pytest

from advisor.cli import main
from advisor.config import build_config, config_from_dict, load_config
from advisor.errors import InputError

T = ["http://127.0.0.1:30000"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"interval_seconds": float("inf"), "targets": T}, "'interval_seconds' must be a finite number"),
        ({"interval_seconds": "inf", "targets": T}, "'interval_seconds' must be a finite number"),
        ({"interval_seconds": 1e308, "targets": T}, "'interval_seconds' must be <= 86400 seconds"),
        ({"interval_seconds": 1e-6, "targets": T}, "'interval_seconds' must be >= 0.05 seconds"),
        ({"interval_seconds": "1e400", "targets": T}, "'interval_seconds' must be a finite number"),
        ({"half_life_seconds": float("nan"), "targets": T}, "'half_life_seconds' must be a finite number"),
        ({"state_bias": float("nan"), "targets": T}, "'state_bias' must be a finite number"),
        ({"state_bias": -0.1, "targets": T}, "'state_bias' must be >= 0"),
        ({"server_info_every": 1e308, "targets": T}, "'server_info_every' must be <= 1e+06"),
        ({"stale_after_cycles": float("inf"), "targets": T}, "'stale_after_cycles' must be a finite number"),
        ({"stale_after_cycles": 2.5, "targets": T}, "'stale_after_cycles' must be a whole number"),
        ({"max_series": 0, "targets": T}, "'max_series' must be > 0"),
        ({"max_line_bytes": 10, "targets": T}, "'max_line_bytes' must be >= 256 bytes"),
        ({"checkpoint_path": ["a", "b"], "targets": T}, "'checkpoint_path' must be a non-empty string"),
        ({"checkpoint_path": 7, "targets": T}, "'checkpoint_path' must be a non-empty string"),
        ({"listen": ["x"], "targets": T}, "'listen' must be HOST:PORT"),
        ({1: "x", "targets": T}, "field names in advisor config must be strings"),
        ({"targets": [{1: "x", "url": T[0]}]}, "field names in targets[0] must be strings"),
        ({"targets": [{"url": T[0], "log_paths": [1, 2]}]}, "'targets[0].log_paths' must be a list of file paths"),
        ({"targets": [{"url": T[0], "boot_log": {"a": 1}}]}, "'targets[0].boot_log' must be a non-empty string"),
        ({"targets": [{"url": T[0], "name": ["n"]}]}, "'targets[0].name' must be a non-empty string"),
        ({"targets": [{"url": T[0], "api_key": 12345}]}, "'targets[0].api_key' must be a non-empty string"),
        ({"targets": [{"url": T[0], "api_key": "a\nb"}]}, "'targets[0].api_key' must be one line"),
        ({"targets": [{"url": T[0], "api_key_env": ["X"]}]}, "'targets[0].api_key_env' must be a non-empty string"),
        ({"targets": [{"url": "http://127.0.0.1:99999"}]}, "'targets[0].url' is not a valid URL"),
        ({"targets": [{"url": "http://"}]}, "'targets[0].url' has no host"),
        ({"targets": [{"url": T[0], "rest_gib": 1e308}]}, "'targets[0].rest_gib' must be <= 100000 GiB"),
        (
            {"targets": [{"url": T[0], "state_bytes_per_slot": float("inf"), "kv_bytes_per_token": 1}]},
            "'targets[0].state_bytes_per_slot' must be a finite number",
        ),
    ],
)
def test_hostile_values_are_named(data: dict, field: str) -> None:
    with pytest.raises(InputError) as err:
        config_from_dict(data, {})
    assert field in str(err.value)
    assert "\n" not in str(err.value)


def test_timeout_not_shorter_than_interval_is_rejected() -> None:
    with pytest.raises(InputError, match="'timeout_seconds' \\(15\\) must be shorter than 'interval_seconds' \\(15\\)"):
        build_config(None, {}, {"target_urls": T, "interval_seconds": 15, "timeout_seconds": 15})
    ok = build_config(None, {}, {"target_urls": T, "interval_seconds": 15, "timeout_seconds": 14.9})
    assert ok.timeout_seconds == 14.9


def test_password_in_url_is_not_in_the_default_name_nor_in_errors() -> None:
    config = config_from_dict({"targets": ["http://admin:hunter2@127.0.0.1:30000/"]}, {})
    assert config.targets[0].name == "127.0.0.1:30000"
    assert config.targets[0].url == "http://admin:hunter2@127.0.0.1:30000"  # kept for Basic auth
    assert config.targets[0].shown_url == "http://127.0.0.1:30000"
    assert "hunter2" not in repr(config) and "admin" not in repr(config)
    with pytest.raises(InputError) as err:
        config_from_dict({"targets": ["http://admin:hunter2@127.0.0.1:99999"]}, {})
    assert "hunter2" not in str(err.value) and "admin" not in str(err.value)


def test_hostile_files(tmp_path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    with pytest.raises(InputError, match="larger than"):
        load_config(big)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"targets: [\xff\xfe]\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_config(binary)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_config(fifo)
    deep = tmp_path / "deep.yaml"
    deep.write_text("targets: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(InputError):
        load_config(deep)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--interval", "inf"], "interval_seconds"),
        (["--interval", "1e-6"], "interval_seconds"),
        (["--interval", "3"], "timeout_seconds"),  # default timeout 5 s is not shorter than 3 s
        (["--half-life", "nan"], "half_life_seconds"),
    ],
)
def test_run_exits_2_naming_the_field(argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--once", "--target", T[0], *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert field in err and len(err.strip().splitlines()) == 1
