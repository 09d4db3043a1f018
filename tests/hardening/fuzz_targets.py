"""The parsers under fuzzing, each as a function of raw bytes, with the one invariant they share: the input is
read or refused with one of our typed errors (`advisor.errors.InputError` and subclasses), nothing else.

Used by tests/hardening/test_fuzz_parsers.py (hypothesis, seeded from tests/fixtures) and bench/fuzz.py
(the long run: hypothesis with many examples, or atheris coverage-guided when it is installed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from advisor.config import config_from_dict, parse_config_text
from advisor.errors import InputError
from advisor.sources.bootlog import parse_boot_log
from advisor.sources.loglines import LogLineParser, digest
from advisor.sources.metrics import parse_metrics
from advisor.sources.server_info import parse_server_info

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEED_WINDOW_LINES = 120  # seeds are windows of the fixtures: small inputs, fast examples, every format kept


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def fuzz_metrics(data: bytes) -> None:
    parse_metrics(_text(data))


def fuzz_boot_log(data: bytes) -> None:
    parse_boot_log(_text(data), source="fuzz")


def fuzz_log_lines(data: bytes) -> None:
    parser = LogLineParser()
    digest(parser.feed(_text(data).split("\n")), source="fuzz")


def fuzz_server_info(data: bytes) -> None:
    try:
        body = json.loads(_text(data))
    except (ValueError, RecursionError):
        return  # not JSON: the HTTP client refuses it before the parser sees it
    if isinstance(body, dict):
        parse_server_info(body)


def fuzz_config(data: bytes) -> None:
    config_from_dict(parse_config_text(data, "fuzz"), {"KEY": "k"})


TARGETS: dict[str, Callable[[bytes], None]] = {
    "metrics": fuzz_metrics,
    "boot_log": fuzz_boot_log,
    "log_lines": fuzz_log_lines,
    "server_info": fuzz_server_info,
    "config": fuzz_config,
}


def _windows(path: Path) -> list[bytes]:
    lines = path.read_bytes().split(b"\n")
    if len(lines) <= SEED_WINDOW_LINES:
        return [b"\n".join(lines)]
    step = SEED_WINDOW_LINES
    return [b"\n".join(lines[start : start + step]) + b"\n" for start in range(0, len(lines), step)][:8]


def seeds(target: str) -> list[bytes]:
    """Seed inputs of a target from the vendored fixtures (windows of the large ones)."""
    if target == "metrics":
        paths = sorted((FIXTURES / "metrics").glob("*.prom")) + sorted((FIXTURES / "real").glob("*.prom"))
        return [path.read_bytes() for path in paths]
    if target in ("boot_log", "log_lines"):
        paths = sorted((FIXTURES / "logs").glob("*.log")) + sorted((FIXTURES / "real").glob("*.log"))
        out: list[bytes] = []
        for path in paths:
            out.extend(_windows(path))
        return out
    if target == "server_info":
        return [path.read_bytes() for path in sorted((FIXTURES / "server_info").glob("*.json"))]
    if target == "config":
        return [
            b"interval_seconds: 15\nlisten: 127.0.0.1:9415\nstate_bias: 0.25\ntimeout_seconds: 5\n"
            b"targets:\n  - name: a\n    url: http://127.0.0.1:30000\n    api_key_env: KEY\n"
            b"    log_paths: [/var/log/a.log]\n    state_bytes_per_slot: 56.4e6\n    kv_bytes_per_token: 13.8e3\n",
            b"targets: [http://127.0.0.1:1, 'http://u:p@127.0.0.1:2/x']\nhalf_life_seconds: 3600\n",
        ]
    raise KeyError(target)


def check(target: str, data: bytes) -> None:
    """Run one input; anything but a return or an InputError is a finding (re-raised)."""
    try:
        TARGETS[target](data)
    except InputError:
        pass
